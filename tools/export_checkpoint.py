#!/usr/bin/env python3
"""Export a pretrain_gpt.py checkpoint (any pipeline / data-parallel layout) as one full
state dict ``{global parameter name: fp32 tensor}``: the optimizer's master weights
reassembled by name (odc_pp/training/checkpoint/resharding.py), e.g. for evaluation or conversion.

    python tools/export_checkpoint.py --load ckpt --output model.pt [--iteration 50]

Decoder layer indices in the names are global (``decoder.layers.<i>.``). The output is
written atomically (temporary file, fsync, rename).
"""

from __future__ import annotations

import argparse
import io
import os
import sys

import torch

from odc_pp.training.checkpoint.checkpointing import checkpoint_dir, read_latest, read_meta
from odc_pp.training.checkpoint.resharding import assemble_by_name
from odc_pp.fsutil import write_file_atomic


def export(load: str, iteration: int | None = None) -> tuple[int, dict[str, torch.Tensor]]:
    """(iteration, full fp32 state dict) of the latest (or the given) checkpoint."""
    if iteration is None:
        found = read_latest(load)
        if found is None:
            raise ValueError(f"no checkpoint under {load} (no 'latest' file)")
        iteration = found[0]
    directory = checkpoint_dir(load, iteration)
    if not os.path.isdir(directory):
        raise ValueError(f"{directory} does not exist; the kept iterations are the "
                         f"iter_* directories in {load}")
    _, tensors = assemble_by_name(directory, read_meta(directory)["world_size"])
    return iteration, {name: entry["master"].view(entry["shape"])
                       for name, entry in sorted(tensors.items())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load", required=True, help="the --save directory of the run")
    parser.add_argument("--output", required=True, help="file to write (torch.save)")
    parser.add_argument("--iteration", type=int, help="default: the latest checkpoint")
    args = parser.parse_args(argv)
    try:
        iteration, state = export(args.load, args.iteration)
    except ValueError as error:
        print(f"export_checkpoint.py: error: {error}", file=sys.stderr)
        return 2
    buffer = io.BytesIO()
    torch.save(state, buffer)
    write_file_atomic(args.output, buffer.getvalue())
    numel = sum(t.numel() for t in state.values())
    print(f"wrote {args.output}: iteration {iteration}, {len(state)} tensors, "
          f"{numel:,} parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
