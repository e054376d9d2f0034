"""Tensor parallelism vs pipeline parallelism (with and without activation offload) on
the same model and the same number of processes: CPU step time and peak activation
memory per rank.

Every layout trains the same GPT (mock data, same seed, same global batch) through
``pretrain_gpt.py`` under torchrun with 2 processes:

* ``tp2``: ``--tensor-model-parallel-size 2`` (ZB-H1 on one stage: W deferred);
* ``tp2_sp``: the same with ``--sequence-parallel``;
* ``tp2_sp_keep``: and ``--keep-sp-input-for-w`` (W keeps B's gathered inputs);
* ``pp2``: ``--pipeline-model-parallel-size 2`` with ZB-H1;
* ``pp2_offload``: pp=2 with the offload schedule (``--cpu-offload``);
* ``pp2_selective`` / ``pp2_full``: pp=2 ZB-H1 with ``--recompute-lgd`` / with
  ``--recompute-granularity full --recompute-method uniform --recompute-num-layers 1``
  (beside ``pp2``: no recompute). Memory rows: compare ``peak_activation_mb``.

Peak activation memory is the runtime's count of saved activation bytes resident on the
compute device (``--log-activation-memory``; offloaded bytes are not resident), including
what deferred weight-gradient work holds from B to W (under SP: the input shard W
re-gathers, or the gathered input it keeps), the max over ranks and iterations; one
stage of these layouts runs each W right after its B, so that peak hardly sees W's
holdings, and ``wgrad_held_mb`` reports them directly: the most one (chunk,
microbatch)'s deferred W holds from its B (the re-gather vs keep trade). Step time is the
median over the iterations after the first (warm-up), then the median (with min-max) over
rounds; layouts alternate within a round and the order rotates between rounds, so load
from other processes hits them alike, and the 1-minute load average before each run is
recorded. Ratios are against ``pp2`` in the same run. Two ranks with one thread each
(ranks <= cores) at a compute-dominated shape (hidden 256, sequences of 1024).

    .venv/bin/python benchmarks/bench_tp.py --json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from odc_pp.testing.bench import emit, load_1min, rotated, spread  # noqa: E402
from odc_pp.testing.torchrun import launch  # noqa: E402  (the one torchrun launcher)

TP2 = ["--tensor-model-parallel-size", "2", "--pipeline-schedule", "zb-h1"]
LAYOUTS = {
    "tp2": TP2,
    "tp2_sp": TP2 + ["--sequence-parallel"],
    "tp2_sp_keep": TP2 + ["--sequence-parallel", "--keep-sp-input-for-w"],
    "pp2": ["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "zb-h1"],
    "pp2_offload": ["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "offload",
                    "--cpu-offload"],
    # activation recompute on pp2: none (pp2) / selective (--recompute-lgd) / full
    "pp2_selective": ["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "zb-h1",
                      "--recompute-lgd"],
    "pp2_full": ["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "zb-h1",
                 "--recompute-granularity", "full", "--recompute-method", "uniform",
                 "--recompute-num-layers", "1"],
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--global-batch", type=int, default=4)
    parser.add_argument("--layouts", default=",".join(LAYOUTS),
                        help="comma-separated subset of " + ",".join(LAYOUTS))
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results",
                                                      "tp_cpu.json"))
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    return parser.parse_args(argv)


def run_once(args, layout: str, tmp, name: str) -> dict:
    flags = ["--num-layers", str(args.layers), "--hidden-size", str(args.hidden),
             "--num-attention-heads", str(args.heads), "--seq-length", str(args.seq),
             "--mock-data", "--vocab-size", "512", "--micro-batch-size", "1",
             "--global-batch-size", str(args.global_batch), "--lr", "1e-3",
             "--train-iters", str(args.iters), "--seed", "1234", "--no-progress-bar",
             "--log-activation-memory", "--distributed-timeout-minutes", "3",
             *LAYOUTS[layout]]
    load = load_1min()
    run = launch(flags, nproc=2, tmp_path=tmp, name=name, timeout=600, launcher="torchrun")
    if run.returncode != 0:
        raise RuntimeError(f"{layout}: {run.describe()}")
    records = run.records()
    return {"step_s": statistics.median(r["step_s"] for r in records[1:]),
            "peak_activation_mb": max(r["peak_activation_mb"] for r in records),
            "peak_memory_mb": max(r["peak_memory_mb"] for r in records),
            "wgrad_held_mb": max(r["wgrad_held_mb"] for r in records),
            "losses": [r["loss"] for r in records], "load_1min": load}


def main(argv=None):
    args = parse_args(argv)
    from pathlib import Path

    layouts = [name for name in args.layouts.split(",") if name]
    unknown = sorted(set(layouts) - set(LAYOUTS))
    if unknown:
        raise SystemExit(f"--layouts: unknown {unknown}; choose from {sorted(LAYOUTS)}")
    runs = {name: [] for name in layouts}
    with tempfile.TemporaryDirectory() as directory:
        for round_ in range(args.rounds):
            for name in rotated(layouts, round_):
                runs[name].append(run_once(args, name, Path(directory), f"{name}_{round_}"))
    result = {"config": {k: v for k, v in vars(args).items() if k not in ("json", "out")},
              "machine": {"cpus": os.cpu_count(), "ranks": 2, "torch_threads_per_rank": 1,
                          "device": "cpu"},
              "layouts": {}}
    for name, rounds in runs.items():
        result["layouts"][name] = {
            "flags": " ".join(LAYOUTS[name]),
            "step_s": statistics.median(r["step_s"] for r in rounds),
            "step_s_rounds": [r["step_s"] for r in rounds],
            "step_s_spread": spread([r["step_s"] for r in rounds]),
            "load_1min": [r["load_1min"] for r in rounds],
            "peak_activation_mb": max(r["peak_activation_mb"] for r in rounds),
            "peak_memory_mb": max(r["peak_memory_mb"] for r in rounds),
            "wgrad_held_mb": max(r["wgrad_held_mb"] for r in rounds),
            "losses": rounds[-1]["losses"]}
    if "pp2" in result["layouts"]:
        base = result["layouts"]["pp2"]
        for entry in result["layouts"].values():
            entry["step_vs_pp2"] = entry["step_s"] / base["step_s"]
            entry["activation_vs_pp2"] = (entry["peak_activation_mb"] /
                                          base["peak_activation_mb"]
                                          if base["peak_activation_mb"] else None)
    emit(result, out=args.out, as_json=args.json)
    return result


if __name__ == "__main__":
    main()
