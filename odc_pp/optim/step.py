"""The optimizer step of a minibatch, one interface for both ways to take it.

The pipeline runtime calls :meth:`OptimizerStep.gradients_final` once per minibatch, when
its gradients are final (the schedule's POST_VALIDATION action, or the end), and never
branches on which step it was given:

* :class:`SynchronousStep`: reduce the global gradient state, then skip (inf/nan
  anywhere), clip or step -- the outcome is known at once;
* :class:`~odc_pp.optim.post_validation.PostValidatedOptimizer`: validate the previous
  minibatch's eager step (while this one ran, its reduction completed), then step this
  one eagerly; the outcome arrives one minibatch later (:attr:`OptimizerStep.deferred`),
  and a rolled-back or clipped previous step asks for this minibatch again
  (:attr:`StepReport.repeat`).

:meth:`OptimizerStep.validate` settles a pending step at once (before a checkpoint, an
evaluation or the exit); the synchronous step never has one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

__all__ = ["StepOutcome", "StepReport", "OptimizerStep", "SynchronousStep"]


@dataclass(frozen=True)
class StepOutcome:
    grad_norm: float
    """Global gradient norm (inf when some gradient was not finite)."""
    action: str
    """"accepted", "clipped" or "skipped"."""


@dataclass(frozen=True, kw_only=True)
class StepReport:
    """What :meth:`OptimizerStep.gradients_final` did with one minibatch's gradients."""

    outcome: StepOutcome | None = None
    """This minibatch's step, when it is known at once (synchronous); None: deferred."""
    validated: StepOutcome | None = None
    """The previous minibatch's deferred step, validated now (None: none was pending)."""
    repeat: bool = False
    """``validated`` rolled back or clipped the step this minibatch's forwards used: its
    gradients were dropped and nothing was stepped; run the minibatch again."""


class OptimizerStep(Protocol):
    """What the runtime calls when a minibatch's gradients are final."""

    deferred: bool
    """Outcomes arrive one minibatch late (:attr:`StepReport.validated`)."""

    def gradients_final(self, lr: float | None) -> StepReport:
        """Take this minibatch's step at ``lr`` (None: the optimizer's own rate)."""

    def validate(self) -> StepOutcome | None:
        """Settle the pending step now; None when nothing is pending."""


class SynchronousStep:
    """Clip and step at once: ``step(lr) -> StepOutcome`` (e.g. ``ShardedAdamW.clip_and_step``
    with the fp16 loss scale around it)."""

    deferred = False

    def __init__(self, step: Callable[[float | None], StepOutcome]) -> None:
        self.step = step

    def gradients_final(self, lr: float | None) -> StepReport:
        return StepReport(outcome=self.step(lr))

    def validate(self) -> None:
        return None
