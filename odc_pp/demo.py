"""``make demo``: the argument for odc-pp, made honestly on this machine.

(a) **Measured here, 2 ranks with 1 thread each** (ranks <= cores, so a waiting rank's
    bubble or barrier costs real time): a compute-dominated model (hidden 256, sequences
    up to 1024 tokens, long-tailed lengths) trained by ``odc_pp.train`` under two
    comparisons, configurations alternating round by round:

    * data parallelism, dp=2: ODC + LB-Mini vs two baselines, each its own line:
      collective + balanced (FSDP-style: ranks meet at every layer's gather and
      reduce-scatter) and Megatron's own ``ddp`` (replicated parameters, one gradient sync
      per minibatch), with ``balanced`` and with Megatron's default split (``none``);
    * pipeline parallelism, pp=2: ZB-H2 vs 1F1B.

    Each prints the per-round ratios' median with min-max and the load average; on a
    busy machine (load above the core count) the ratios are printed but flagged.
(b) **Correctness, 4 ranks**: the composed pp=2 (ZB-V) x dp=2 (ODC, LB-Mini) job and the
    conventional 1F1B x collective + balanced job give the same losses (the loss is the
    token mean over the whole global batch, whatever the split). 4 ranks on 2 cores cannot
    show speed, so no speed is printed for it.
(c) **Predicted for a cluster**: ``odc-pp plan`` for Llama-3-8B SFT on 4 x 8 H100 with a
    LongAlign-like length distribution: odc-pp's best configuration against the
    Megatron default, with the flags that reproduce both.

Everything goes to ``demo_output/`` in the current directory. It runs the installed
package (``torchrun -m odc_pp.train``, ``python -m odc_pp.cli``), so a ``pip install``-ed
odc-pp runs it from anywhere. A part that cannot run says what it skipped and why.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field

from odc_pp.planner.inputs import LONGALIGN_LIKE  # part (c)'s lengths

__all__ = ["main", "Comparison", "measure", "correctness", "predicted", "plan_arguments", "PLAN_MODEL_FLAGS", "PLAN_GPUS"]

SPEED_MODEL = ["--num-layers", "2", "--hidden-size", "256", "--num-attention-heads", "4",
               "--seq-length", "1024", "--max-position-embeddings", "1024",
               "--vocab-size", "512", "--mock-data", "--global-batch-size", "8",
               "--micro-batch-size", "1", "--lr", "1e-3", "--min-lr", "1e-4",
               "--lr-warmup-iters", "1", "--seed", "1234"]
"""The timed model: 2 layers of hidden 256, 8 samples per step with long-tailed lengths up
to 1024 (median 256): attention and matmuls dominate, and one step takes about a second."""

TINY_MODEL = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
              "--seq-length", "256", "--max-tokens-per-microbatch", "256",
              "--global-batch-size", "32", "--vocab-size", "128", "--mock-data",
              "--lr", "3e-3", "--min-lr", "3e-4", "--lr-warmup-iters", "3", "--seed", "1234"]
"""The correctness model (4 ranks)."""

COMPARISONS = {
    "dp=2": {"ours": ("ODC + LB-Mini", ["--dp-mode", "odc", "--load-balance", "lb-mini"]),
             "bases": [("collective + balanced (FSDP-style, lock-step per layer)",
                        ["--dp-mode", "collective", "--load-balance", "balanced"]),
                       ("ddp + balanced (Megatron DDP, one sync per minibatch)",
                        ["--dp-mode", "ddp", "--load-balance", "balanced"]),
                       ("ddp + none (Megatron DDP, Megatron's default split)",
                        ["--dp-mode", "ddp", "--load-balance", "none"])]},
    "pp=2": {"ours": ("ZB-H2", ["--pipeline-model-parallel-size", "2",
                                "--pipeline-schedule", "zb-h2"]),
             "bases": [("1F1B", ["--pipeline-model-parallel-size", "2",
                                 "--pipeline-schedule", "1f1b"])]},
}
"""name -> {"ours": (label, flags), "bases": [(label, flags), ...]}; every side of one
comparison shares the model, and odc-pp's side is compared with each baseline in turn."""


@dataclass(kw_only=True)
class Comparison:
    """One measured comparison: per-round step times of both sides."""

    name: str
    """Which comparison ("dp=2", "pp=2")."""
    ours: str
    """Label of odc-pp's side."""
    base: str
    """Label of the baseline."""
    ours_s: list[float] = field(default_factory=list)
    """Median step time of odc-pp's side per round (s)."""
    base_s: list[float] = field(default_factory=list)
    """Median step time of the baseline per round (s)."""
    load: list[float] = field(default_factory=list)
    """1-minute load average before each round."""

    @property
    def ratios(self) -> list[float]:
        """Per-round speedup (baseline time / ours)."""
        return [b / o for o, b in zip(self.ours_s, self.base_s)]

    def line(self) -> str:
        r = self.ratios
        busy = max(self.load) > (os.cpu_count() or 2)
        return (f"{self.name}: {self.ours} vs {self.base}: {statistics.median(r):.2f}x faster "
                f"(median of {len(r)} rounds, min {min(r):.2f}, max {max(r):.2f}; step "
                f"{statistics.median(self.ours_s):.3f} s vs {statistics.median(self.base_s):.3f}"
                f" s; load average {min(self.load):.1f}-{max(self.load):.1f}"
                f"{', BUSY MACHINE: ratios not meaningful' if busy else ''})")


def _torchrun(flags: list[str], *, nproc: int, log: str, timeout_s: float) -> list[dict]:
    """Run ``torchrun -m odc_pp.train`` (1 thread per rank); its JSON log records."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(nproc), "-m", "odc_pp.train",
               *flags, "--no-progress-bar", "--log-interval", "1", "--log-json", log,
               "--distributed-timeout-minutes", "3"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    process = subprocess.Popen(command, env=env, start_new_session=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        process.communicate()
        raise RuntimeError(f"torchrun did not finish within {timeout_s:.0f} s") from None
    if process.returncode != 0:
        raise RuntimeError(f"torchrun exited with status {process.returncode}:\n"
                           f"{output[-3000:]}")
    with open(log) as handle:
        return [r for r in map(json.loads, filter(str.strip, handle)) if "step_s" in r]


def measure(out_dir: str, *, rounds: int = 3, iterations: int = 3,
            warmup: int = 1) -> list[Comparison]:
    """Part (a): every comparison, its sides (odc-pp's and each baseline) taking turns
    within a round and the order rotating between rounds; a side's time is its median
    step after ``warmup``. One :class:`Comparison` per baseline."""
    results = []
    for name, sides in COMPARISONS.items():
        labelled = [sides["ours"], *sides["bases"]]
        times: list[list[float]] = [[] for _ in labelled]
        loads = []
        for round_index in range(rounds):
            shift = round_index % len(labelled)
            loads.append(os.getloadavg()[0])
            for index in [*range(shift, len(labelled)), *range(shift)]:
                log = os.path.join(out_dir,
                                   f"{name.replace('=', '')}_{index}_{round_index}.jsonl")
                records = _torchrun(SPEED_MODEL + labelled[index][1] +
                                    ["--train-iters", str(iterations)], nproc=2, log=log,
                                    timeout_s=300)
                times[index].append(statistics.median(r["step_s"] for r in records[warmup:]))
        for (label, _), base_s in zip(sides["bases"], times[1:]):
            comparison = Comparison(name=name, ours=sides["ours"][0], base=label,
                                    ours_s=times[0], base_s=base_s, load=loads)
            print(comparison.line(), flush=True)
            results.append(comparison)
    return results


def correctness(out_dir: str, *, iterations: int = 6) -> dict:
    """Part (b): the composed pp=2 x dp=2 job and the conventional one, same losses."""
    setups = {"odc-pp (ZB-V x ODC + LB-Mini)":
              ["--pipeline-schedule", "zbv", "--dp-mode", "odc", "--load-balance", "lb-mini"],
              "conventional (1F1B x collective + balanced)":
              ["--pipeline-schedule", "1f1b", "--dp-mode", "collective",
               "--load-balance", "balanced"]}
    losses = {}
    for label, flags in setups.items():
        log = os.path.join(out_dir, f"correctness_{len(losses)}.jsonl")
        trace = os.path.join(out_dir, f"trace_{len(losses)}.json")
        records = _torchrun(TINY_MODEL + ["--pipeline-model-parallel-size", "2",
                                          "--train-iters", str(iterations),
                                          "--trace", trace] + flags,
                            nproc=4, log=log, timeout_s=400)
        losses[label] = [r["loss"] for r in records]
    ours, base = losses.values()
    worst = max(abs(a - b) / abs(b) for a, b in zip(ours, base))
    for label, curve in losses.items():
        print(f"  {label}: loss {' '.join(f'{x:.4f}' for x in curve)}")
    print(f"  max relative loss difference {worst:.1e} (4 ranks on 2 cores: correctness "
          f"only; a waiting rank lends its core, so this run cannot show speed). Traces: "
          f"{out_dir}/trace_0.json, trace_1.json (open in Perfetto)", flush=True)
    return {"losses": losses, "max_relative_difference": worst}


PLAN_MODEL_FLAGS = ("--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 "
                    "--num-attention-heads 32 --num-query-groups 8 --group-query-attention "
                    "--seq-length 32768 --vocab-size 128256 --swiglu "
                    "--position-embedding-type rope --normalization RMSNorm "
                    "--untie-embeddings-and-output-weights")  # Llama-3-8B is untied
"""Part (c)'s model: Llama-3-8B's shape as Megatron flags."""
PLAN_GPUS = 32
"""Part (c)'s job: 4 nodes x 8 H100."""


def plan_arguments(json_path: str) -> list[str]:
    """``odc-pp plan``'s arguments of part (c) (after ``plan``), the predictions written
    to ``json_path``."""
    return ["--model-flags", PLAN_MODEL_FLAGS, "--cluster", "h100", "--gpus", str(PLAN_GPUS),
            "--lengths-histogram", LONGALIGN_LIKE, "--global-batch", "128", "--top", "3",
            "--json", json_path]


def predicted(out_dir: str) -> str:
    """Part (c): ``odc-pp plan`` for Llama-3-8B SFT on 4 x 8 H100."""
    command = [sys.executable, "-m", "odc_pp.cli", "plan",
               *plan_arguments(os.path.join(out_dir, "plan.json"))]
    done = subprocess.run(command, text=True, capture_output=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"odc-pp plan failed:\n{done.stderr[-2000:]}")
    return done.stdout


def _part(title: str, skipped: list[str], run):
    print(f"\n== {title} ==", flush=True)
    try:
        return run()
    except Exception as exc:  # a missing component must not hide the rest of the demo
        skipped.append(f"{title}: {type(exc).__name__}: {exc}")
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m odc_pp.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="demo_output",
                        help="output folder (default: demo_output in the current directory)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of (a)")
    parser.add_argument("--skip-measure", action="store_true", help="skip part (a)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    shutil.rmtree(args.out, ignore_errors=True)
    os.makedirs(args.out)
    started, skipped = time.perf_counter(), []
    measured = None
    if not args.skip_measure:
        measured = _part("(a) measured on this machine: 2 ranks x 1 thread, hidden 256, "
                         "long-tailed lengths up to 1024", skipped,
                         lambda: measure(args.out, rounds=args.rounds))
    checked = _part("(b) correctness: pp=2 x dp=2 (4 ranks), composed vs conventional",
                    skipped, lambda: correctness(args.out))
    plan = _part("(c) predicted: Llama-3-8B SFT on 4 x 8 H100, LongAlign-like lengths "
                 "(odc-pp plan)", skipped, lambda: predicted(args.out))
    if plan:
        print(plan)
    summary = {"measured": [asdict(c) | {"ratios": c.ratios} for c in measured or []],
               "correctness": checked, "skipped": skipped,
               "wall_s": time.perf_counter() - started}
    with open(os.path.join(args.out, "summary.json"), "w") as handle:
        json.dump(summary, handle, indent=1)
    for item in skipped:
        print(f"SKIPPED {item}")
    print(f"demo took {summary['wall_s']:.0f} s; everything is in {args.out}/")
    return 1 if skipped else 0


if __name__ == "__main__":
    sys.exit(main())
