"""Measure the activation bytes per token of one decoder layer of every layer kind with
the FakeTensor dry run's machinery and write the planner's table
(``odc_pp/planner/layer_activations.json``, read by :mod:`odc_pp.planner.layer_kinds`).

    PYTHONPATH=. python tools/measure_layer_activations.py [--only KEY ...] [--out PATH]

``--shard I/N`` measures every N-th kind (one process per core), ``--merge A B`` joins
the shards' tables into ``--out``. Kinds already in ``--out`` are kept (``--remeasure`` measures them again); the file is
rewritten after every kind, so an interrupted run resumes where it stopped."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from odc_pp.planner.layer_kinds import TABLE_PATH, LayerKind, all_kinds  # noqa: E402

COMMAND = "PYTHONPATH=. python tools/measure_layer_activations.py"


def _load(path: str) -> dict:
    if os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    return {}


def _write(table: dict, kinds: dict, path: str) -> None:
    table["kinds"] = dict(sorted(kinds.items()))
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(table, handle, indent=1)
        handle.write("\n")
    os.replace(path + ".tmp", path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(TABLE_PATH))
    parser.add_argument("--only", nargs="*", default=None, help="kind keys to measure")
    parser.add_argument("--remeasure", action="store_true")
    parser.add_argument("--shard", default="0/1", help="I/N: every N-th kind from the I-th")
    parser.add_argument("--merge", nargs="*", default=[],
                        help="tables (e.g. of other shards) whose kinds --out takes first")
    args = parser.parse_args(argv)
    import megatron.core
    import torch

    from odc_pp.training.layer_measure import CHECK_SHAPE, SHAPES, measure_kind

    table = _load(args.out)
    kinds = table.get("kinds", {})
    for path in args.merge:
        kinds.update(_load(path).get("kinds", {}))
    table.update(command=COMMAND, torch=torch.__version__,
                 megatron_core=megatron.core.__version__,
                 units="bytes per token of one decoder layer, bf16, one microbatch",
                 shapes=[vars(s) for s in SHAPES], check_shape=vars(CHECK_SHAPE))
    index, count = (int(x) for x in args.shard.split("/"))
    wanted = [LayerKind.from_key(k) for k in args.only] if args.only else all_kinds()
    wanted = [] if args.merge and not args.only else wanted[index::count]
    _write(table, kinds, args.out)
    for kind in wanted:
        if kind.key in kinds and not args.remeasure:
            continue
        start = time.time()
        kinds[kind.key] = measure_kind(kind)
        _write(table, kinds, args.out)
        print(f"{kind.key}: saved {kinds[kind.key]['saved']['total']} "
              f"({time.time() - start:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
