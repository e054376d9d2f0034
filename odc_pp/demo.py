"""``make demo``: the embedded default job.

1. Schedule engine: the comparison table of every schedule family for pp=4, m=8 under a
   ZB-style cost model (simulated), and a PNG timeline of ZB-V.
2. Training, the composed system: a tiny megatron-core GPT trained on CPU through torchrun
   and gloo with pp=2 (ZB-V) x dp=2 (ODC, LB-Mini) on the built-in synthetic long-tailed
   corpus, ~8 microbatches per pipeline (a steady-state pipeline, m >= 2 pp); saves a
   checkpoint and the picture of the schedule it trained with.
3. Training, the conventional setup on the same data and seed: 1F1B x collective
   data parallelism with token-balanced replicas and equal microbatch counts.
4. One side-by-side table: step time, tokens/s, idle time per rank, and the losses (equal
   to rounding, since the loss is the token mean over the whole global batch).

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


SETUPS = {
    # name: (pipeline schedule, dp mode, load balance)
    "odc-pp": ("zbv", "odc", "lb-mini"),
    "conventional": ("1f1b", "collective", "balanced"),
}
"""The composed system and the conventional setup it is compared with (same model, data,
seed, pp=2 x dp=2, 32 samples per global batch packed under a 256-token cap: 5-8
microbatches per pipeline, a steady-state pipeline, m >= 2 pp)."""


def training_command(out_dir: str, iterations: int, setup: str) -> list[str]:
    schedule, dp_mode, balance = SETUPS[setup]
    run_dir = os.path.join(out_dir, setup)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "4", os.path.join(ROOT, "pretrain_gpt.py"),
               "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
               "--seq-length", "256", "--max-tokens-per-microbatch", "256",
               "--global-batch-size", "32",
               "--pipeline-model-parallel-size", "2", "--pipeline-schedule", schedule,
               "--dp-mode", dp_mode, "--load-balance", balance,
               "--lr", "3e-3", "--min-lr", "3e-4", "--lr-warmup-iters", "3",
               "--train-iters", str(iterations), "--log-interval", "1",
               "--mock-data", "--vocab-size", "128", "--seed", "1234", "--no-progress-bar",
               "--log-json", os.path.join(run_dir, "train.jsonl"),
               "--distributed-timeout-minutes", "3"]
    if setup == "odc-pp":
        command += ["--save", os.path.join(run_dir, "checkpoints"),
                    "--save-interval", str(iterations),
                    "--schedule-png", os.path.join(run_dir, "schedule_trained.png")]
    return command


def training_part(out_dir: str, setup: str, *, iterations: int = 30,
                  timeout_s: float = 600) -> dict:
    """Run one setup of the embedded job; returns its summary."""
    run_dir = os.path.join(out_dir, setup)
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    started = time.perf_counter()
    process = subprocess.Popen(training_command(out_dir, iterations, setup), cwd=ROOT,
                               env=env, start_new_session=True)
    try:
        code = process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        process.wait()
        raise RuntimeError(f"{setup}: training did not finish within {timeout_s:.0f} s")
    if code != 0:
        raise RuntimeError(f"{setup}: torchrun exited with status {code} (messages above)")
    with open(os.path.join(run_dir, "train.jsonl")) as handle:
        records = [json.loads(line) for line in handle if line.strip()]
    steady = records[2:] or records  # the first iterations build runtimes and plans
    checkpoint = os.path.join(run_dir, "checkpoints", f"iter_{iterations:07d}")
    picture = os.path.join(run_dir, "schedule_trained.png")
    return {"setup": setup, "losses": [r["loss"] for r in records],
            "step_s": sum(r["step_s"] for r in steady) / len(steady),
            "tokens_per_s": sum(r["tokens_per_s"] for r in steady) / len(steady),
            "microbatches": [n for r in records for n in r["microbatches_per_replica"]],
            "idle_s_per_rank": [sum(r["idle_s"][k] for r in steady) / len(steady)
                                for k in range(len(steady[0]["idle_s"]))],
            "checkpoint": checkpoint if os.path.isdir(checkpoint) else None,
            "trained_picture": picture if os.path.isfile(picture) else None,
            "wall_s": time.perf_counter() - started}


def comparison_table(ours: dict, baseline: dict) -> str:
    """The side-by-side table of the two setups (same data, same seed)."""
    rel = max(abs(a - b) / abs(b) for a, b in zip(ours["losses"], baseline["losses"]))
    rows = [("", "odc-pp: ZB-V x ODC + LB-Mini", "1F1B x collective + balanced", "ratio"),
            ("step time (s, mean)", f"{ours['step_s']:.3f}", f"{baseline['step_s']:.3f}",
             f"{baseline['step_s'] / ours['step_s']:.2f}x faster"),
            ("tokens/s", f"{ours['tokens_per_s']:.0f}", f"{baseline['tokens_per_s']:.0f}",
             f"{ours['tokens_per_s'] / baseline['tokens_per_s']:.2f}x"),
            ("idle s/iteration per rank",
             " ".join(f"{v:.3f}" for v in ours["idle_s_per_rank"]),
             " ".join(f"{v:.3f}" for v in baseline["idle_s_per_rank"]),
             f"{sum(ours['idle_s_per_rank']) / max(sum(baseline['idle_s_per_rank']), 1e-9):.2f}x"),
            ("microbatches per pipeline (min-max)",
             f"{min(ours['microbatches'])}-{max(ours['microbatches'])}",
             f"{min(baseline['microbatches'])}-{max(baseline['microbatches'])}", ""),
            ("loss first -> last",
             f"{ours['losses'][0]:.4f} -> {ours['losses'][-1]:.4f}",
             f"{baseline['losses'][0]:.4f} -> {baseline['losses'][-1]:.4f}",
             f"max rel. diff {rel:.1e}")]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths))
                     for row in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m odc_pp.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(ROOT, "demo_output"))
    parser.add_argument("--iterations", type=int, default=30)
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

    runs = {}
    if args.skip_training:
        skipped.append("training: --skip-training given")
    else:
        for number, setup in enumerate(SETUPS, start=2):
            schedule, dp_mode, balance = SETUPS[setup]
            print(f"\n== {number}. training ({setup}): tiny GPT on long-tailed synthetic data, "
                  f"pp=2 ({schedule}) x dp=2 ({dp_mode}, {balance}), {args.iterations} "
                  f"iterations on CPU (torchrun, gloo) ==", flush=True)
            try:
                runs[setup] = training_part(args.out, setup, iterations=args.iterations)
            except Exception as exc:
                skipped.append(f"training ({setup}): {type(exc).__name__}: {exc}")

    print("\n== summary: same model, data and seed; pp=2 x dp=2 ==")
    if len(runs) == 2:
        print(comparison_table(runs["odc-pp"], runs["conventional"]))
        ours = runs["odc-pp"]
        print(f"checkpoint: {ours['checkpoint']}")
        print(f"picture of the schedule trained with: {ours['trained_picture']}")
    if "picture" in summary:
        print(f"ZB-V picture (pp=4 comparison): {summary['picture']}")
    with open(os.path.join(args.out, "summary.json"), "w") as handle:
        json.dump({"runs": runs, "skipped": skipped}, handle, indent=1)
    for item in skipped:
        print(f"SKIPPED {item}")
    return 1 if skipped and not args.skip_training else 0


if __name__ == "__main__":
    sys.exit(main())
