"""Optimizer post-validation benchmark: step time with the global norm / inf check
overlapped with the next minibatch vs synchronous (pp ranks, gloo, this machine's CPU).

For each schedule (default zb-h2 and zbv), two copies of the same megatron-core GPT
chunks train with torch AdamW on the same microbatches through one ``PipelineRuntime``
each, on the schedule lowered with POST_VALIDATION:

* ``synchronous``: the minibatch, then the global gradient state (one blocking all-reduce
  over the pipeline: every rank waits for the last one to finish its backward), clip if
  needed, step;
* ``overlapped``: a ``PostValidatedOptimizer`` steps eagerly at each rank's
  POST_VALIDATION and validates at the next minibatch's (a rolled-back or clipped step
  repeats that minibatch; with the default ``--max-grad-norm`` none does).

A timed block is ``--steps`` consecutive iterations (barrier before and after; the
overlapped block ends with the last step's validation), reported per iteration; the two
modes alternate in ``--rounds`` rounds so load from other processes hits both alike, and
the median over rounds is reported, with ``paired_speedup``: the median over rounds of
synchronous / overlapped time within a round (robust to load that changes between
rounds). The losses of both modes are compared bit for bit.

    .venv/bin/python benchmarks/bench_post_validation.py --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.bench_runtime import make_data  # noqa: E402  (same synthetic microbatches)
from odc_pp.testing.launch import LaunchConfig, run_workers  # noqa: E402

MODES = ("synchronous", "overlapped")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4, help="iterations per timed block")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-grad-norm", type=float, default=1e6,
                        help="clip threshold (default: never binds, so nothing repeats)")
    parser.add_argument("--schedules", default="zb-h2,zbv")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results",
                                                      "post_validation_cpu.json"))
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    return parser.parse_args(argv)


class Trainer:
    """One model copy trained in one mode; ``block(n)`` runs n iterations."""

    def __init__(self, mode, schedule, microbatches, args, groups):
        from odc_pp.megatron.model import ModelConfig, build_chunks
        from odc_pp.runtime import (PipelineRuntime, PostValidatedOptimizer,
                                    PostValidationConfig, RuntimeConfig)

        config = ModelConfig(vocab_size=128, hidden_size=args.hidden,
                             num_layers=args.layers, num_attention_heads=4,
                             max_sequence_length=args.seq)
        self.chunks = build_chunks(config, pp_rank=dist.get_rank(), pp_size=args.pp,
                                   num_chunks=schedule.num_chunks,
                                   placement=schedule.placement, process_groups=groups)
        self.params = [p for chunk in self.chunks for p in chunk.parameters()]
        self.optimizer = torch.optim.AdamW(self.params, lr=1e-3)
        self.mode, self.schedule, self.microbatches = mode, schedule, microbatches
        self.max_norm = args.max_grad_norm
        self.validator = None
        if mode == "overlapped":
            self.validator = PostValidatedOptimizer(
                PostValidationConfig(max_grad_norm=self.max_norm), optimizer=self.optimizer,
                group=dist.group.WORLD)
        self.runtime = PipelineRuntime(RuntimeConfig(), chunks=self.chunks,
                                       pp_group=dist.group.WORLD,
                                       optimizer_step=self.validator)
        self.losses, self.repeats = [], 0

    def iteration(self):
        from odc_pp.optim import clip

        result = self.runtime.run_minibatch(self.schedule, self.microbatches)
        while result.repeat:
            self.repeats += 1
            result = self.runtime.run_minibatch(self.schedule, self.microbatches)
        self.losses.append(result.loss_sum)
        if self.validator is not None:
            return
        grads = [p.grad for p in self.params if p.grad is not None]
        state = clip.global_grad_state(
            clip.local_sum_of_squares(grads, dtype=torch.float64, device="cpu"),
            dist.group.WORLD, device="cpu", timeout_s=300)
        if state.finite:
            clip.clip_(grads, state, self.max_norm)
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def block(self, steps):
        """Seconds per iteration of ``steps`` consecutive iterations (slowest rank)."""
        dist.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            self.iteration()
        if self.validator is not None:
            self.validator.validate()  # the block's last step is checked inside the block
        elapsed = torch.tensor([(time.perf_counter() - start) / steps], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        return float(elapsed)


def worker(rank, world_size, args):
    from odc_pp.training.distributed import standalone_process_groups
    from odc_pp.schedule.costs import CostModel
    from odc_pp.schedule.generators import generate
    from odc_pp.schedule.lowering import lower

    torch.set_num_threads(args.threads)
    groups = standalone_process_groups()
    microbatches = make_data(args)
    rows = []
    for name in args.schedules.split(","):
        costs = CostModel()
        schedule = lower(generate(name, pp=args.pp, num_microbatches=args.microbatches,
                                  costs=costs), costs, post_validation=True)
        trainers = {mode: Trainer(mode, schedule, microbatches, args, groups)
                    for mode in MODES}
        for trainer in trainers.values():
            trainer.block(1)  # warm-up
        times = {mode: [] for mode in MODES}
        for _ in range(args.rounds):
            for mode, trainer in trainers.items():
                times[mode].append(trainer.block(args.steps))
        sync, over = (statistics.median(times[mode]) for mode in MODES)
        gathered = [None] * world_size
        dist.all_gather_object(gathered, {mode: t.losses for mode, t in trainers.items()})
        losses = {mode: [sum(x for x in step if x is not None)
                         for step in zip(*(g[mode] for g in gathered))] for mode in MODES}
        paired = statistics.median(s / o for s, o in zip(times["synchronous"],
                                                         times["overlapped"]))
        rows.append({"schedule": name, "synchronous_step_s": sync, "overlapped_step_s": over,
                     "speedup": sync / over, "paired_speedup": paired,
                     "synchronous_times_s": times["synchronous"],
                     "overlapped_times_s": times["overlapped"],
                     "repeated_minibatches": trainers["overlapped"].repeats,
                     "validations": [o.action for o in trainers["overlapped"].validator.history],
                     "losses_bitwise_equal": losses["synchronous"] == losses["overlapped"]})
    return rows if rank == 0 else None


def main(argv=None):
    args = parse_args(argv)
    rows = run_workers(worker, args.pp, args,
                       config=LaunchConfig(timeout_s=3600, process_group_timeout_s=300,
                                           threads_per_rank=args.threads))[0]
    for row in rows:
        outcomes = row.pop("validations")
        row["validation_outcomes"] = {o: outcomes.count(o) for o in sorted(set(outcomes))}
    result = {"config": {k: v for k, v in vars(args).items() if k not in ("json", "out")},
              "machine": {"cpus": os.cpu_count(), "torch": torch.__version__,
                          "backend": "gloo"},
              "rows": rows}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as handle:
        json.dump(result, handle, indent=1)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for row in rows:
            print(f"{row['schedule']:8s} synchronous {row['synchronous_step_s'] * 1e3:.1f} ms"
                  f"  overlapped {row['overlapped_step_s'] * 1e3:.1f} ms"
                  f"  speedup {row['speedup']:.3f}x (paired {row['paired_speedup']:.3f}x)"
                  f"  losses equal "
                  f"{row['losses_bitwise_equal']}")
    return result


if __name__ == "__main__":
    main()
