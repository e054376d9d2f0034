"""Extension points of the trainer for the programs that run it (the tests' fault
injection, :mod:`odc_pp.testing.faults`): what happens before each iteration and around
the optimizer step. The product passes none; the defaults do nothing."""

from __future__ import annotations

from odc_pp.optim.step import OptimizerStep

__all__ = ["TrainingHooks"]


class TrainingHooks:
    """Subclass and pass to ``odc_pp.training.pretrain(argv, hooks=...)``."""

    def before_iteration(self, iteration: int, topo) -> None:
        """Called on every rank before iteration ``iteration`` (0-based) starts."""

    def optimizer_step(self, step: OptimizerStep, *, engine, topo) -> OptimizerStep:
        """The optimizer step the runtime will take (``step``, or one that wraps it);
        ``engine``: the data-parallel engine whose owned gradients it steps."""
        return step
