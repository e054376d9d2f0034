"""Optimizer post-validation: step eagerly, validate while the next minibatch runs.

``step()`` starts one non-blocking all-reduce of this rank's (squared grad norm,
non-finite flag) over ``group`` (every pipeline stage, and data-parallel shards if grads
are sharded), snapshots what a rollback needs, steps the wrapped optimizer and publishes
the step (``finish_step``), so no rank waits for the others at the end of a minibatch and
the next minibatch starts on the stepped parameters. ``validate()`` -- called by
``PipelineRuntime`` at the next minibatch's POST_VALIDATION, i.e. after that minibatch's
gradients are final and before its own step, or by the caller before a checkpoint or at
the end -- waits for the reduction (which had the whole minibatch to complete) and:

* any inf/NaN gradient on any stage: restore parameters and optimizer state (the step
  is skipped everywhere, as a synchronous inf check would do);
* global norm above ``max_grad_norm``: restore, scale the step's gradients by
  ``max_grad_norm / (norm + eps)`` and step again (identical to synchronous clipping);
* otherwise keep the eager step.

After a restore or a redo it publishes again and drops every gradient accumulated since
the eager step: a minibatch that ran on the rolled-back parameters must be run again
(``PipelineRuntime`` reports it as ``MinibatchResult.repeat``), so the losses and
parameters are those of synchronous validation. The caller pays one extra minibatch per
rollback or clip, and none when the step is accepted.

The norm, the non-finite check, the coefficient and the scaling are those of
:mod:`odc_pp.optim.clip` (shared with the synchronous step), so the outcome is bit for
bit that of a synchronous check. Optimizers compose with it through the
:class:`PostValidationTarget` protocol:

* ``odc_pp.odc.ShardedAdamW`` implements it itself (its snapshot keeps a copy of the
  owned gradient shards, which ``finish_step`` zeroes for the next minibatch);
* any torch optimizer reading ``param.grad`` (AdamW included) through
  :class:`TorchOptimizerTarget`, which keeps a copy of the step's gradients.

``group`` may be one process group or a sequence of them, reduced one after the other
(e.g. ``[data-parallel shard group, pipeline group]``: each rank's owned gradient shard
is a disjoint piece of the model, so the sum over all pp x dp ranks is the global norm;
with replicated shards, e.g. hierarchical data parallelism, reduce over one copy only).
Only the first reduction runs in the background: give one group covering every
contributing rank for a full overlap.

Rollback restores exact copies, so it is bit-exact in fp32, bf16 and fp16. The price is
one copy of parameters, gradients and optimizer state, held from ``step()`` to
``validate()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from . import clip
from .rates import decoupled_rate
from .step import StepOutcome, StepReport

__all__ = ["PostValidationConfig", "PostValidatedOptimizer",
           "PostValidationTarget", "TorchOptimizerTarget", "as_target"]


@dataclass(kw_only=True)
class PostValidationConfig:
    """Clipping and waiting behaviour of :class:`PostValidatedOptimizer`."""

    max_grad_norm: float | None = 1.0
    """Clip the global gradient norm to this value; None: never clip (inf/NaN still skip)."""
    eps: float = clip.DEFAULT_EPS
    """Added to the norm in the clipping coefficient (as torch's clip_grad_norm_)."""
    timeout_s: float = 300.0
    """Longest wait for the global gradient state."""

    def __post_init__(self) -> None:
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm must be > 0 or None, got {self.max_grad_norm}")
        if self.eps < 0 or self.timeout_s <= 0:
            raise ValueError("eps must be >= 0 and timeout_s > 0")


@runtime_checkable
class PostValidationTarget(Protocol):
    """What :class:`PostValidatedOptimizer` needs from an optimizer.

    Contract, in the order the wrapper calls it for one minibatch:

    1. :meth:`local_grad_norm_sq` -- this rank's share of the squared global gradient
       norm, computed with :func:`odc_pp.optim.clip.local_sum_of_squares` (an inf/NaN
       gradient entry must make it non-finite, which that function guarantees). The
       shares of the ranks in the wrapper's groups must partition the model's gradient.
    2. :meth:`snapshot` (it must keep a copy of the step's gradients), then
       :meth:`step_eagerly` -- the update from the current gradients -- and
       :meth:`finish_step` -- publish it and clear the gradients: the next minibatch
       runs on it and accumulates fresh gradients.
    3. After the global state arrives, exactly one of: nothing (accepted),
       :meth:`restore` (skipped) or :meth:`redo_clipped` (clipped), each followed by
       :meth:`finish_step` (publish the corrected step, drop the gradients accumulated
       since step 2).

    :meth:`zero_grad` may be called at any time after :meth:`step_eagerly`.
    """

    def local_grad_norm_sq(self) -> torch.Tensor:
        """This rank's sum of squared gradient entries (0-dim tensor)."""

    def snapshot(self) -> object:
        """Everything a rollback of the next :meth:`step_eagerly` needs."""

    def step_eagerly(self, lr: float | None = None) -> None:
        """Apply the update from the current gradients (not yet final) at learning rate
        ``lr`` (None: the optimizer's own)."""

    def restore(self, snapshot: object) -> None:
        """Undo the eager step: parameters and optimizer state as in ``snapshot``."""

    def redo_clipped(self, snapshot: object, coefficient: float,
                     lr: float | None = None) -> None:
        """Undo the eager step and step again on that step's gradients (kept in
        ``snapshot``) scaled by ``coefficient`` (with :func:`odc_pp.optim.clip.scale_`),
        at ``lr``: the learning rate the eager step was given."""

    def finish_step(self) -> None:
        """Publish the parameters and clear the gradients."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients the next minibatch accumulates into."""


def _group_rate(group: dict, lr: float) -> float:
    """The rate of a torch param group at the step's ``lr``: the decoupled rate for a
    group marked ``decoupled``, else ``lr`` (a plain float either way)."""
    return float(decoupled_rate(lr) if group.get("decoupled") else lr)


class TorchOptimizerTarget:
    """A ``torch.optim.Optimizer`` whose gradients are the parameters' ``.grad``.

    The snapshot keeps the step's gradient tensors by reference, not as copies:
    :meth:`finish_step` right after the step sets every ``.grad`` to None, so the next
    minibatch accumulates into new tensors and nothing else can reach the kept ones. This
    needs an optimizer whose ``step`` does not modify gradients in place (torch's
    built-in optimizers do not). A given rate replaces every param group's; a group with
    ``decoupled=True`` takes a :class:`~odc_pp.optim.rates.StepRates`' decoupled rate."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.params = [p for g in optimizer.param_groups for p in g["params"]]

    def local_grad_norm_sq(self) -> torch.Tensor:
        return clip.local_sum_of_squares(
            [p.grad for p in self.params if p.grad is not None], dtype=torch.float64,
            device=self.params[0].device if self.params else "cpu")

    def snapshot(self) -> dict:
        return {
            "hyper": [{k: v for k, v in group.items() if k != "params"}
                      for group in self.optimizer.param_groups],
            "params": [p.detach().clone() for p in self.params],
            "grads": [None if p.grad is None else p.grad.detach() for p in self.params],
            "state": [{k: (v.clone() if torch.is_tensor(v) else v)
                       for k, v in self.optimizer.state.get(p, {}).items()}
                      for p in self.params],
        }

    def step_eagerly(self, lr: float | None = None) -> None:
        if lr is not None:  # a given rate replaces every param group's
            for group in self.optimizer.param_groups:
                group["lr"] = _group_rate(group, lr)
        self.optimizer.step()

    @torch.no_grad()
    def restore(self, snapshot: dict) -> None:
        for index, param in enumerate(self.params):
            param.copy_(snapshot["params"][index])
            saved_state = snapshot["state"][index]
            if saved_state:
                self.optimizer.state[param] = saved_state
            else:
                self.optimizer.state.pop(param, None)

    @torch.no_grad()
    def redo_clipped(self, snapshot: dict, coefficient: float,
                     lr: float | None = None) -> None:
        self.restore(snapshot)
        clip.scale_([grad for grad in snapshot["grads"] if grad is not None], coefficient)
        for param, grad in zip(self.params, snapshot["grads"]):
            param.grad = grad
        current = [{k: v for k, v in group.items() if k != "params"}
                   for group in self.optimizer.param_groups]
        for group, hyper in zip(self.optimizer.param_groups, snapshot["hyper"]):
            group.update(hyper)  # the eager step's learning rate etc.
            if lr is not None:
                group["lr"] = _group_rate(group, lr)
        self.optimizer.step()
        for group, hyper in zip(self.optimizer.param_groups, current):
            group.update(hyper)

    def finish_step(self) -> None:
        """Parameters are updated in place (nothing to publish); clear the gradients."""
        self.optimizer.zero_grad(set_to_none=True)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)


def as_target(optimizer) -> PostValidationTarget:
    """``optimizer`` as a :class:`PostValidationTarget`: a torch optimizer gets
    :class:`TorchOptimizerTarget`; one implementing the protocol (``ShardedAdamW``) is
    returned as it is."""
    if isinstance(optimizer, torch.optim.Optimizer):
        return TorchOptimizerTarget(optimizer)
    if isinstance(optimizer, PostValidationTarget):
        return optimizer
    raise ValueError(f"cannot post-validate a {type(optimizer).__name__}: pass a torch "
                     "optimizer, an odc_pp.odc.ShardedAdamW or a PostValidationTarget")


class PostValidatedOptimizer:
    """Wraps an optimizer with eager steps and deferred global validation."""

    def __init__(self, config: PostValidationConfig, *, optimizer,
                 group=None, device: torch.device | str = "cpu") -> None:
        self.config = config
        self.optimizer = optimizer
        self.target = as_target(optimizer)
        self.groups = clip.group_list(group)
        self.device = torch.device(device)
        self._pending = None
        self.history: list[StepOutcome] = []

    deferred = True
    """Its outcomes arrive one minibatch late (odc_pp.optim.step.OptimizerStep)."""

    def gradients_final(self, lr: float | None = None) -> StepReport:
        """The runtime's call when a minibatch's gradients are final: validate the
        previous eager step; when it was rolled back or clipped, this minibatch's
        gradients were dropped (``repeat``); else step eagerly at ``lr``."""
        validated = self.validate()
        if validated is not None and validated.action != "accepted":
            return StepReport(validated=validated, repeat=True)
        self.step(lr)
        return StepReport(validated=validated)

    @property
    def pending(self) -> bool:
        """An eager step awaits validation."""
        return self._pending is not None

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.target.zero_grad(set_to_none=set_to_none)

    def step(self, lr: float | None = None) -> None:
        """Start the global grad-state reduction, snapshot, step eagerly at ``lr`` (None:
        the optimizer's own learning rate) and publish."""
        if self._pending is not None:
            raise ValueError("PostValidatedOptimizer.step(): the previous step is not "
                             "validated yet; call validate() first (a rollback there "
                             "drops the gradients this step would use)")
        reduction = clip.GradStateReduction(self.target.local_grad_norm_sq(), self.groups,
                                            device=self.device,
                                            timeout_s=self.config.timeout_s)
        snapshot = self.target.snapshot()
        self.target.step_eagerly(lr)
        self.target.finish_step()
        self._pending = (reduction, snapshot, lr)

    def validate(self) -> StepOutcome | None:
        """Finish the pending step (see module docstring); None if nothing is pending.
        Unless the outcome is "accepted", the gradients accumulated since :meth:`step`
        were dropped: repeat the minibatch that produced them."""
        if self._pending is None:
            return None
        reduction, snapshot, lr = self._pending
        self._pending = None
        state = reduction.wait()
        max_norm = self.config.max_grad_norm
        if not state.finite:
            self.target.restore(snapshot)
            outcome = StepOutcome(grad_norm=state.norm, action="skipped")
        elif max_norm is not None and \
                (coefficient := clip.clip_coefficient(state.norm, max_norm,
                                                      self.config.eps)) < 1.0:
            self.target.redo_clipped(snapshot, coefficient, lr)
            outcome = StepOutcome(grad_norm=state.norm, action="clipped")
        else:
            outcome = StepOutcome(grad_norm=state.norm, action="accepted")
        if outcome.action != "accepted":
            self.target.finish_step()
        self.history.append(outcome)
        return outcome
