#!/usr/bin/env python3
"""ODC + LB-Mini against collective + balanced and Megatron's ddp, swept over the batch
per replica, in the padded and the packed path (issue 22's sweep; issue 49's baselines).

Every point trains the same model on the same data with ``pretrain_gpt.py`` under
torchrun: dp = 2, two ranks with one thread each (ranks <= cores on the 2-core machine, so
a rank that waits for its peer costs real time), a compute-dominated shape (hidden 256,
sequences up to 1024 tokens) and the built-in long-tailed corpus (``--mock-data``:
log-normal lengths, median 256 = seq/4, sigma 1, clipped to [8, 1024]; about 8% of the
samples sit at the 1024 cap, most are short: a LongAlign-like shape scaled to 1K).

* **padded**: ``--micro-batch-size 2``, rows padded to their longest sample (lb-mini:
  ``--no-pack-sequences``, at most 2 samples per microbatch, grouped by padded cost);
* **packed**: ``--pack-sequences``, rows of at most 1024 tokens.

Configurations take turns within each round and the order rotates between rounds; a
configuration's time in a round is its mean step after the warm-up step. The speedup of a
round is collective + balanced's time over the configuration's (``speedup_vs_baseline``;
``speedup_vs`` holds one such ratio per baseline the run includes: collective + balanced,
the FSDP-style lock-step, and ``ddp`` + none / ``ddp`` + balanced, Megatron's DDP, which
syncs once per minibatch), reported as median with min-max over the rounds (a
run's time is its mean step after one warm-up step: throughput), next to the 1-minute load average before each run, the per-rank
idle time (step - busy, from the training log) and the microbatches per replica.

    python benchmarks/bench_lb_mini.py --json --out benchmarks/results/lb_mini_sweep.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from odc_pp.testing.bench import emit, load_1min, rotated, spread  # noqa: E402
from odc_pp.testing.torchrun import launch  # noqa: E402

MODEL = ["--num-layers", "2", "--hidden-size", "256", "--num-attention-heads", "4",
         "--seq-length", "1024", "--max-position-embeddings", "1024", "--vocab-size", "512",
         "--mock-data", "--lr", "1e-3", "--min-lr", "1e-4", "--lr-warmup-iters", "1",
         "--seed", "1234", "--no-progress-bar", "--log-interval", "1",
         "--distributed-timeout-minutes", "3"]
"""The timed model (the demo's): attention and matmuls dominate a step."""

PATHS = {"padded": ["--micro-batch-size", "2"],
         "packed": ["--micro-batch-size", "1", "--pack-sequences"]}
"""Flags every configuration of a path shares."""

CONFIGS = {"collective+balanced": ["--dp-mode", "collective", "--load-balance", "balanced"],
           "odc+balanced": ["--dp-mode", "odc", "--load-balance", "balanced"],
           "odc+lb-mini": ["--dp-mode", "odc", "--load-balance", "lb-mini"],
           "ddp+none": ["--dp-mode", "ddp", "--load-balance", "none"],
           "ddp+balanced": ["--dp-mode", "ddp", "--load-balance", "balanced"]}
"""Every configuration a run may pick with ``--configs``; ``ddp`` is Megatron's own data
parallelism (one gradient sync per minibatch, replicated parameters)."""

BASELINE = "collective+balanced"
"""FSDP-style lock-step: ``speedup_vs_baseline``'s numerator."""

BASELINES = ("collective+balanced", "ddp+none", "ddp+balanced")
"""Every baseline a run includes gets its own ratio per configuration (``speedup_vs``)."""

DEFAULT_CONFIGS = "collective+balanced,odc+balanced,odc+lb-mini,ddp+none,ddp+balanced"
"""What a run measures unless ``--configs`` says otherwise."""


def config_flags(path: str, config: str) -> list[str]:
    flags = PATHS[path] + CONFIGS[config]
    if path == "padded" and config.endswith("lb-mini"):
        flags = flags + ["--no-pack-sequences"]
    return flags


def run_point(path: str, config: str, per_replica: int, iterations: int, tmp: Path,
              name: str, extra: list[str]) -> dict:
    """One training run; its measured step times, idle times and microbatch counts."""
    flags = MODEL + extra + config_flags(path, config) + [
        "--global-batch-size", str(2 * per_replica), "--train-iters", str(iterations)]
    load = load_1min()
    run = launch(flags, nproc=2, tmp_path=tmp, name=name, timeout=600, launcher="torchrun")
    if run.returncode != 0:
        raise RuntimeError(f"{name} failed: {run.describe()}")
    records = run.records()[1:]  # the first step warms up
    return {"step_s": statistics.fmean(r["step_s"] for r in records),
            "idle_s": [statistics.median(r["idle_s"][k] for r in records) for k in range(2)],
            "busy_s": [statistics.median(r["busy_s"][k] for r in records) for k in range(2)],
            "microbatches_per_replica": [r["microbatches_per_replica"] for r in records],
            "load_1min": load}


def sweep(batches: list[int], paths: list[str], rounds: int, iterations: int,
          extra: list[str], names: list[str]) -> dict:
    """Every (path, batch) point, configurations rotating within and between rounds."""
    runs: dict = {}
    with tempfile.TemporaryDirectory(prefix="lbmini-") as tmp:
        for round_index in range(rounds):
            order = rotated(names, round_index)
            for path in paths:
                for per_replica in batches:
                    for config in order:
                        name = f"{path}_{per_replica}_{config}_{round_index}"
                        result = run_point(path, config, per_replica, iterations, Path(tmp),
                                           name.replace("+", "_"), extra)
                        runs.setdefault((path, per_replica), {}).setdefault(
                            config, []).append(result)
                        print(f"round {round_index} {path:6s} b={per_replica:<2d} "
                              f"{config:20s} step {result['step_s']:.3f} s  idle "
                              f"{result['idle_s']}  load {result['load_1min']:.2f}",
                              file=sys.stderr, flush=True)
    return runs


def summarize(runs: dict) -> list[dict]:
    points = []
    for (path, per_replica), configs in sorted(runs.items()):
        bases = {b: [r["step_s"] for r in configs[b]] for b in BASELINES if b in configs}
        point = {"path": path, "samples_per_replica": per_replica,
                 "flags": {c: " ".join(config_flags(path, c)) for c in configs},
                 "configs": {}}
        for config, results in configs.items():
            times = [r["step_s"] for r in results]
            speedup_vs = {b: spread([x / t for x, t in zip(base, times)], digits=3)
                          for b, base in bases.items() if b != config}
            point["configs"][config] = {
                "step_s_rounds": [round(t, 4) for t in times],
                "step_s_median": round(statistics.median(times), 4),
                "speedup_vs_baseline": speedup_vs.get(BASELINE, spread([1.0], digits=3)),
                "speedup_vs": speedup_vs,
                "idle_s_per_rank_median": [round(statistics.median(
                    r["idle_s"][k] for r in results), 4) for k in range(2)],
                "busy_s_per_rank_median": [round(statistics.median(
                    r["busy_s"][k] for r in results), 4) for k in range(2)],
                "microbatches_per_replica": results[0]["microbatches_per_replica"],
                "load_1min": [round(r["load_1min"], 2) for r in results]}
        points.append(point)
    return points


def verdict(points: list[dict]) -> dict:
    """The issue's three conditions, per path (when the run measured all three
    configurations they compare)."""
    out = {}
    if not points or not {"odc+lb-mini", "odc+balanced", BASELINE} <= set(
            points[0]["configs"]):
        return out
    for path in sorted({p["path"] for p in points}):
        mine = [p for p in points if p["path"] == path]
        ours = [p["configs"]["odc+lb-mini"]["speedup_vs_baseline"]["median"] for p in mine]
        odc_bal = [p["configs"]["odc+balanced"]["speedup_vs_baseline"]["median"] for p in mine]
        out[path] = {"peak_speedup": max(ours),
                     "peak_at_samples_per_replica": mine[ours.index(max(ours))][
                         "samples_per_replica"],
                     "min_speedup": min(ours),
                     "peak_at_least_1.2": max(ours) >= 1.2,
                     "never_below_1.0": min(ours) >= 1.0,
                     "never_below_odc_balanced": all(a >= b for a, b in zip(ours, odc_bal))}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="2,4,8,16",
                        help="samples per replica (global batch = 2 x this)")
    parser.add_argument("--paths", default="padded,packed", help="padded and/or packed")
    parser.add_argument("--configs", default=DEFAULT_CONFIGS,
                        help=f"comma-separated, from {', '.join(CONFIGS)}; rotating within "
                             f"each round; must include at least one of {', '.join(BASELINES)}")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=5,
                        help="training iterations per run (the first warms up)")
    parser.add_argument("--sample-cost-model", default=None,
                        help="a calibrated cost file (bench_planner_validation.py --measure "
                             "--write-sample-cost) every configuration plans with; default: "
                             "the FLOPs formula")
    parser.add_argument("--json", action="store_true", help="print the JSON document")
    parser.add_argument("--out", default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    paths = args.paths.split(",")
    if args.rounds < 1 or args.iterations < 2 or not set(paths) <= set(PATHS):
        parser.error("--rounds >= 1, --iterations >= 2, --paths from padded,packed")
    names = args.configs.split(",")
    if not set(names) <= set(CONFIGS) or not set(names) & set(BASELINES):
        parser.error(f"--configs {args.configs!r}: pick from {', '.join(CONFIGS)}, with at "
                     f"least one of {', '.join(BASELINES)}")
    started = time.perf_counter()
    extra = ["--sample-cost-model", args.sample_cost_model] if args.sample_cost_model else []
    points = summarize(sweep(batches, paths, args.rounds, args.iterations, extra, names))
    doc = {"benchmark": "bench_lb_mini", "doc": __doc__.split("\n\n")[1],
           "machine": {"cpus": os.cpu_count(), "ranks": 2, "threads_per_rank": 1,
                       "device": "cpu (gloo)"},
           "settings": {"model": " ".join(MODEL + extra), "rounds": args.rounds,
                        "configs": names,
                        "iterations": args.iterations, "warmup_iterations": 1},
           "points": points, "verdict": verdict(points),
           "wall_s": round(time.perf_counter() - started, 1)}
    emit(doc, out=args.out, as_json=args.json)
    if not args.json:
        for p in points:
            for c, v in p["configs"].items():
                row = "  ".join(f"vs {b} {r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})"
                                for b, r in v["speedup_vs"].items())
                print(f"{p['path']:6s} b={p['samples_per_replica']:<2d} {c:20s} {row}")
        print(json.dumps(doc["verdict"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
