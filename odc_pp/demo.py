"""``make demo``: the embedded default job.

1. Schedule engine: the comparison table of every schedule family for pp=4, m=8 under a
   ZB-style cost model (simulated), and a PNG timeline of ZB-V.
2. Training: a tiny megatron-core GPT trained for 50 iterations on CPU through torchrun
   and gloo with pp=2 (ZB-V) x dp=2 (ODC, LB-Mini) on the built-in synthetic long-tailed
   corpus; prints the loss falling and each rank's idle time, saves a checkpoint and the
   picture of the schedule it trained with (``schedule_trained.png``, rank 0's pipeline
   in the first iteration, simulated with the cost model the schedule was built for).

Everything goes to ``demo_output/``. A part that cannot run says what it skipped and why.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

__all__ = ["main", "schedule_part", "training_part"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def schedule_part(out_dir: str, *, pp: int = 4, num_microbatches: int = 8) -> dict:
    """Comparison table + ZB-V picture; returns {"table": str, "png": path}."""
    from odc_pp.schedule.compare import (build_schedule, compare_schedules, format_table,
                                         per_chunk_costs)
    from odc_pp.schedule.costs import CostModel
    from odc_pp.schedule.render import render_png
    from odc_pp.schedule.simulator import simulate

    # ZB paper's typical ratios: F = B = W, a small transfer cost; the host link moves one
    # microbatch-chunk of activations per forward time (for the offload schedule)
    costs = CostModel(t_f=1.0, t_b=1.0, t_w=1.0, t_comm=0.05, offload_bandwidth=1.0)
    rows = compare_schedules(pp, num_microbatches, costs)
    table = format_table(rows)
    zbv_costs = per_chunk_costs(costs, 2)  # the table's convention: a rank's time split over its chunks
    zbv = build_schedule("zbv", pp=pp, num_microbatches=num_microbatches, costs=zbv_costs)
    png = render_png(zbv, simulate(zbv, zbv_costs), os.path.join(out_dir, "schedule_zbv.png"))
    return {"table": table, "png": png}


def training_command(out_dir: str, iterations: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", "4", os.path.join(ROOT, "pretrain_gpt.py"),
            "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
            "--seq-length", "128", "--micro-batch-size", "2", "--global-batch-size", "16",
            "--pipeline-model-parallel-size", "2", "--pipeline-schedule", "zbv",
            "--dp-mode", "odc", "--load-balance", "lb-mini",
            "--lr", "3e-3", "--min-lr", "3e-4", "--lr-warmup-iters", "3",
            "--train-iters", str(iterations), "--log-interval", "1",
            "--mock-data", "--vocab-size", "128", "--seed", "1234", "--no-progress-bar",
            "--save", os.path.join(out_dir, "checkpoints"), "--save-interval", str(iterations),
            "--log-json", os.path.join(out_dir, "train.jsonl"),
            "--schedule-png", os.path.join(out_dir, "schedule_trained.png"),
            "--distributed-timeout-minutes", "3"]


def training_part(out_dir: str, *, iterations: int = 50, timeout_s: float = 900) -> dict:
    """Run the embedded training job; returns its summary."""
    log = os.path.join(out_dir, "train.jsonl")
    picture = os.path.join(out_dir, "schedule_trained.png")
    shutil.rmtree(os.path.join(out_dir, "checkpoints"), ignore_errors=True)
    for stale in (log, picture):
        if os.path.exists(stale):
            os.remove(stale)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    started = time.perf_counter()
    process = subprocess.Popen(training_command(out_dir, iterations), cwd=ROOT, env=env,
                               start_new_session=True)
    try:
        code = process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        process.wait()
        raise RuntimeError(f"training did not finish within {timeout_s:.0f} s")
    if code != 0:
        raise RuntimeError(f"torchrun exited with status {code} (messages above)")
    with open(log) as handle:
        records = [json.loads(line) for line in handle if line.strip()]
    checkpoint = os.path.join(out_dir, "checkpoints", f"iter_{iterations:07d}")
    return {"first_loss": records[0]["loss"], "last_loss": records[-1]["loss"],
            "tokens_per_s": sum(r["tokens_per_s"] for r in records) / len(records),
            "idle_s_per_rank": [sum(r["idle_s"][k] for r in records) / len(records)
                                for k in range(len(records[0]["idle_s"]))],
            "checkpoint": checkpoint if os.path.isdir(checkpoint) else None,
            "trained_picture": picture if os.path.isfile(picture) else None,
            "wall_s": time.perf_counter() - started, "iterations": records[-1]["iteration"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m odc_pp.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(ROOT, "demo_output"))
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--skip-training", action="store_true")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    summary, skipped = {}, []

    print("== 1. schedules: pp=4, m=8, F=B=W=1, transfer 0.05, offload 1.0 (simulated) ==",
          flush=True)
    try:
        part = schedule_part(args.out)
        print(part["table"])
        print(f"ZB-V timeline: {part['png']}", flush=True)
        summary["picture"] = part["png"]
    except Exception as exc:  # a missing component must not hide the rest of the demo
        skipped.append(f"schedule table/picture: {type(exc).__name__}: {exc}")

    if args.skip_training:
        skipped.append("training: --skip-training given")
    else:
        print(f"\n== 2. training: tiny GPT, pp=2 (ZB-V) x dp=2 (ODC, LB-Mini), "
              f"{args.iterations} iterations on CPU (torchrun, gloo) ==", flush=True)
        try:
            summary.update(training_part(args.out, iterations=args.iterations))
        except Exception as exc:
            skipped.append(f"training: {type(exc).__name__}: {exc}")

    print("\n== summary ==")
    if "first_loss" in summary:
        print(f"loss: {summary['first_loss']:.4f} -> {summary['last_loss']:.4f} over "
              f"{summary['iterations']} iterations ({summary['wall_s']:.0f} s wall)")
        print(f"throughput: {summary['tokens_per_s']:.0f} tokens/s (mean of logged iterations)")
        print("idle time per rank (mean s/iteration): " + ", ".join(
            f"rank {r}: {v:.3f}" for r, v in enumerate(summary["idle_s_per_rank"])))
        print(f"checkpoint: {summary['checkpoint']}")
        print(f"picture of the schedule trained with: {summary['trained_picture']}")
    if "picture" in summary:
        print(f"ZB-V picture (pp=4 comparison): {summary['picture']}")
    for item in skipped:
        print(f"SKIPPED {item}")
    return 1 if skipped and not args.skip_training else 0


if __name__ == "__main__":
    sys.exit(main())
