"""Fault injection for the tests: ``python -m odc_pp.testing.faults [FAULT FLAGS] FLAGS``
trains like ``python -m odc_pp.train FLAGS`` with these faults installed through
:class:`odc_pp.training.hooks.TrainingHooks` (the product's flags know nothing of them):

* ``--inject-fault-rank R --inject-fault-iter I``: rank R kills itself (SIGKILL) before
  iteration I (1-based) -- the job must fail with a message naming it; with
  ``--inject-fault-signal STOP`` it stops itself (SIGSTOP) instead: a hung peer, which the
  others must name within ``--distributed-timeout-minutes``;
* ``--inject-nonfinite-grad-iter I``: the last rank writes inf into its first owned
  gradient element at iteration I, just before the optimizer step takes the gradients
  (synchronous, or the eager step of post-validation; again if the minibatch repeats):
  every rank must skip that step;
* ``--inject-sigterm-iter I``: rank 0 sends itself SIGTERM at the start of iteration I
  (1-based): a preemption during that iteration, at a known point.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
from dataclasses import dataclass

from odc_pp.optim.step import OptimizerStep, StepOutcome, StepReport
from odc_pp.training.hooks import TrainingHooks

__all__ = ["FaultInjection", "parse_fault_flags", "inject_nonfinite_grad", "main"]


def inject_nonfinite_grad(engine) -> None:
    """Write inf into this rank's first non-empty owned gradient."""
    for grad in engine.owned_grads():
        if grad.numel():
            grad.view(-1)[0] = math.inf
            return
    raise ValueError("--inject-nonfinite-grad-iter: the injecting rank owns no gradient "
                     "element (use a larger model)")


@dataclass(kw_only=True)
class FaultInjection(TrainingHooks):
    """The faults of :func:`parse_fault_flags`."""

    fault_rank: int | None = None
    """This rank SIGKILLs itself before :attr:`fault_iter`."""
    fault_iter: int = 1
    """1-based iteration of the killed rank's fault."""
    fault_signal: str = "KILL"
    """What the faulty rank sends itself: ``KILL`` (a crash) or ``STOP`` (a hang)."""
    nonfinite_iter: int | None = None
    """1-based iteration whose optimizer step gets an inf on the last rank."""
    armed: bool = False
    """The current iteration's optimizer step injects."""
    sigterm_iter: int | None = None
    """1-based iteration at whose start rank 0 sends itself SIGTERM."""

    def before_iteration(self, iteration: int, topo) -> None:
        if self.fault_rank == topo.rank and iteration + 1 == self.fault_iter:
            print(f"rank {topo.rank}: injected fault at iteration {iteration + 1} "
                  f"(SIG{self.fault_signal}, pid {os.getpid()})", file=sys.stderr,
                  flush=True)
            os.kill(os.getpid(), getattr(signal, f"SIG{self.fault_signal}"))
        if self.sigterm_iter == iteration + 1 and topo.rank == 0:
            os.kill(os.getpid(), signal.SIGTERM)  # handled: the stop is decided after it
        self.armed = self.nonfinite_iter == iteration + 1 and \
            topo.rank == topo.world_size - 1

    def optimizer_step(self, step: OptimizerStep, *, engine, topo) -> OptimizerStep:
        return _InjectingStep(step, engine, self)


class _InjectingStep:
    """``step``, with an inf in the owned gradients while the faults are armed."""

    def __init__(self, step: OptimizerStep, engine, faults: FaultInjection) -> None:
        self.step, self.engine, self.faults = step, engine, faults
        self.deferred = step.deferred

    def gradients_final(self, lr: float | None) -> StepReport:
        if self.faults.armed:
            inject_nonfinite_grad(self.engine)
        return self.step.gradients_final(lr)

    def validate(self) -> StepOutcome | None:
        return self.step.validate()


def parse_fault_flags(argv: list[str]) -> tuple[FaultInjection, list[str]]:
    """(the faults, the training flags left)."""
    parser = argparse.ArgumentParser(prog="python -m odc_pp.testing.faults", add_help=False)
    parser.add_argument("--inject-fault-rank", type=int, default=None)
    parser.add_argument("--inject-fault-iter", type=int, default=1)
    parser.add_argument("--inject-fault-signal", choices=("KILL", "STOP"), default="KILL")
    parser.add_argument("--inject-nonfinite-grad-iter", type=int, default=None)
    parser.add_argument("--inject-sigterm-iter", type=int, default=None)
    known, rest = parser.parse_known_args(argv)
    if known.inject_nonfinite_grad_iter is not None and known.inject_nonfinite_grad_iter < 1:
        raise ValueError("--inject-nonfinite-grad-iter must be >= 1")
    if known.inject_fault_iter < 1:
        raise ValueError("--inject-fault-iter must be >= 1")
    return FaultInjection(fault_rank=known.inject_fault_rank,
                          fault_iter=known.inject_fault_iter,
                          fault_signal=known.inject_fault_signal,
                          nonfinite_iter=known.inject_nonfinite_grad_iter,
                          sigterm_iter=known.inject_sigterm_iter), rest


def main(argv: list[str] | None = None) -> int:
    from odc_pp.training import pretrain

    try:
        faults, rest = parse_fault_flags(sys.argv[1:] if argv is None else argv)
    except ValueError as exc:
        print(f"odc_pp.testing.faults: error: {exc}", file=sys.stderr, flush=True)
        return 2
    return pretrain(rest, hooks=faults)


if __name__ == "__main__":
    sys.exit(main())
