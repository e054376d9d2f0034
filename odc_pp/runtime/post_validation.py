"""Optimizer post-validation: step eagerly, validate when the global state arrives.

``step()`` starts a non-blocking all-reduce of this rank's (squared grad norm, non-finite
flag) over ``group`` (every pipeline stage, and data-parallel shards if grads are
sharded), snapshots what a rollback needs and steps the wrapped optimizer at once, so no
stage waits for the others at the end of a minibatch. ``validate()`` (the schedule's
POST_VALIDATION action, the start of the next minibatch, or right after ``step()``)
waits for the reduction and:

* any inf/NaN gradient on any stage: restore parameters and optimizer state (the step
  is skipped everywhere, as a synchronous inf check would do);
* global norm above ``max_grad_norm``: restore, scale the step's gradients by
  ``max_grad_norm / (norm + eps)`` and step again (identical to synchronous clipping);
* otherwise keep the eager step.

Two kinds of optimizer compose with it, through :class:`PostValidationTarget`:

* any torch optimizer reading ``param.grad`` (AdamW included): :class:`TorchOptimizerTarget`;
* the sharded optimizer of the ODC engine (``odc_pp.odc.ShardedAdamW``: gradients live in
  the engine's owned accumulators, ``step(finish=False)`` updates the owned shards without
  publishing them, ``engine.finish_step()`` publishes): :class:`ShardedOptimizerTarget`.
  Its gradients stay in place until ``finish_step``, so validation must run before the
  next minibatch's first forward (``PipelineRuntime`` does so when given this wrapper as
  ``post_validator``; the training frontend validates right after the eager step).

``group`` may be one process group or a sequence of them, reduced one after the other
(e.g. ``[data-parallel shard group, pipeline group]``: each rank's owned gradient shard
is a disjoint piece of the model, so the sum over all pp x dp ranks is the global norm;
with replicated shards, e.g. hierarchical data parallelism, reduce over one copy only).

Rollback restores exact copies, so it is bit-exact in fp32, bf16 and fp16. The price is
one copy of parameters (and, for torch optimizers, gradients) and optimizer state, held
from ``step()`` to ``validate()``.
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass
from typing import Iterable, Protocol, runtime_checkable

import torch
import torch.distributed as dist

__all__ = ["PostValidationConfig", "PostValidatedOptimizer", "StepOutcome",
           "PostValidationTarget", "TorchOptimizerTarget", "ShardedOptimizerTarget",
           "global_grad_norm_sq", "as_target"]


@dataclass(kw_only=True)
class PostValidationConfig:
    """Clipping and waiting behaviour of :class:`PostValidatedOptimizer`."""

    max_grad_norm: float | None = 1.0
    """Clip the global gradient norm to this value; None: never clip (inf/NaN still skip)."""
    eps: float = 1e-6
    """Added to the norm in the clipping coefficient (as torch's clip_grad_norm_)."""
    timeout_s: float = 300.0
    """Longest wait for the global gradient state."""

    def __post_init__(self) -> None:
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm must be > 0 or None, got {self.max_grad_norm}")
        if self.eps < 0 or self.timeout_s <= 0:
            raise ValueError("eps must be >= 0 and timeout_s > 0")


@dataclass(frozen=True)
class StepOutcome:
    grad_norm: float
    """Global gradient norm (inf when some gradient was not finite)."""
    action: str
    """"accepted", "clipped" or "skipped"."""


def global_grad_norm_sq(params: Iterable[torch.nn.Parameter]) -> tuple[float, bool]:
    """(sum of squared gradient entries in float64, all finite) of the local gradients."""
    total = torch.zeros((), dtype=torch.float64)
    for param in params:
        if param.grad is not None:
            total += param.grad.detach().double().pow(2).sum().cpu()
    value = float(total)
    return value, math.isfinite(value)


@runtime_checkable
class PostValidationTarget(Protocol):
    """What :class:`PostValidatedOptimizer` needs from an optimizer."""

    def local_grad_state(self) -> tuple[float, bool]:
        """(this rank's share of the squared global grad norm, all its grads finite)."""

    def snapshot(self) -> object:
        """Everything a rollback of the next :meth:`step_eagerly` needs."""

    def step_eagerly(self) -> None:
        """Apply the update from the current gradients (not yet final)."""

    def rollback(self, snapshot: object) -> None:
        """Undo the eager step: parameters and optimizer state as in ``snapshot``."""

    def redo_clipped(self, snapshot: object, coefficient: float) -> None:
        """Undo the eager step and step again on that step's gradients x ``coefficient``."""

    def finish(self) -> None:
        """The step is final (after validation)."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients the next minibatch accumulates into."""


class TorchOptimizerTarget:
    """A ``torch.optim.Optimizer`` whose gradients are the parameters' ``.grad``.

    The snapshot keeps the step's gradients too: the next minibatch may already
    accumulate into ``.grad`` before validation."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.params = [p for g in optimizer.param_groups for p in g["params"]]

    def local_grad_state(self) -> tuple[float, bool]:
        return global_grad_norm_sq(self.params)

    def snapshot(self) -> dict:
        return {
            "params": [p.detach().clone() for p in self.params],
            "grads": [None if p.grad is None else p.grad.detach().clone() for p in self.params],
            "state": [{k: (v.clone() if torch.is_tensor(v) else v)
                       for k, v in self.optimizer.state.get(p, {}).items()}
                      for p in self.params],
        }

    def step_eagerly(self) -> None:
        self.optimizer.step()

    @torch.no_grad()
    def rollback(self, snapshot: dict) -> None:
        for index, param in enumerate(self.params):
            param.copy_(snapshot["params"][index])
            saved_state = snapshot["state"][index]
            if saved_state:
                self.optimizer.state[param] = saved_state
            else:
                self.optimizer.state.pop(param, None)

    @torch.no_grad()
    def redo_clipped(self, snapshot: dict, coefficient: float) -> None:
        current_grads = [p.grad for p in self.params]  # may already be the next step's
        self.rollback(snapshot)
        for param, grad in zip(self.params, snapshot["grads"]):
            param.grad = None if grad is None else grad.mul_(coefficient)
        self.optimizer.step()
        for param, grad in zip(self.params, current_grads):
            param.grad = grad

    def finish(self) -> None:
        pass  # torch optimizers publish nothing: parameters are updated in place

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)


class ShardedOptimizerTarget:
    """``odc_pp.odc.ShardedAdamW``: gradients are the engine's owned accumulators, which
    stay untouched until ``engine.finish_step()`` (called by :meth:`finish`); so the
    snapshot holds only the owned master weights and moments."""

    def __init__(self, optimizer) -> None:
        self.optimizer = optimizer
        self.engine = optimizer.engine

    def local_grad_state(self) -> tuple[float, bool]:
        # same arithmetic as a synchronous check: fp32 local sum, reduced in float64
        norm_sq = float(self.optimizer.local_grad_norm_sq().double())
        finite = math.isfinite(norm_sq) and not self.optimizer.local_has_nonfinite()
        return norm_sq, finite

    def snapshot(self) -> dict:
        return self.optimizer.snapshot()

    def step_eagerly(self) -> None:
        self.optimizer.step(finish=False)

    def rollback(self, snapshot: dict) -> None:
        self.optimizer.restore(snapshot)

    @torch.no_grad()
    def redo_clipped(self, snapshot: dict, coefficient: float) -> None:
        self.optimizer.restore(snapshot)
        for grad in self.engine.owned_grads():
            grad.mul_(coefficient)
        self.optimizer.step(finish=False)

    def finish(self) -> None:
        self.engine.finish_step()  # zero the accumulators, publish the final shards

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass  # finish() zeroes the engine's accumulators


def as_target(optimizer) -> PostValidationTarget:
    """The adapter for ``optimizer`` (a torch optimizer, a sharded optimizer with
    ``engine``/``snapshot``/``restore``/``step(finish=...)``, or a target already)."""
    if isinstance(optimizer, torch.optim.Optimizer):
        return TorchOptimizerTarget(optimizer)
    if all(hasattr(optimizer, name) for name in
           ("engine", "snapshot", "restore", "local_grad_norm_sq", "local_has_nonfinite")):
        return ShardedOptimizerTarget(optimizer)
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
        self.groups = list(group) if isinstance(group, (list, tuple)) else [group]
        if not self.groups:
            raise ValueError("group: give a process group, None (WORLD) or a non-empty list")
        self.device = torch.device(device)
        self._pending = None
        self.history: list[StepOutcome] = []

    @property
    def pending(self) -> bool:
        """An eager step awaits validation."""
        return self._pending is not None

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.target.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        """Start the global grad-state reduction, snapshot, and step eagerly."""
        if self._pending is not None:
            self.validate()
        norm_sq, finite = self.target.local_grad_state()
        state = torch.tensor([norm_sq if finite else 0.0, 0.0 if finite else 1.0],
                             dtype=torch.float64, device=self.device)
        work = dist.all_reduce(state, group=self.groups[0], async_op=True)
        snapshot = self.target.snapshot()
        self.target.step_eagerly()
        self._pending = (work, state, snapshot)

    def validate(self) -> StepOutcome | None:
        """Finish the pending step (see module docstring); None if nothing is pending."""
        if self._pending is None:
            return None
        work, state, snapshot = self._pending
        self._pending = None
        self._wait(work, 0)
        for index, group in enumerate(self.groups[1:], start=1):
            self._wait(dist.all_reduce(state, group=group, async_op=True), index)
        norm_sq, nonfinite = state.tolist()
        norm = math.sqrt(norm_sq)
        coefficient = 1.0 if self.config.max_grad_norm is None else \
            self.config.max_grad_norm / (norm + self.config.eps)
        if nonfinite > 0 or not math.isfinite(norm_sq):
            self.target.rollback(snapshot)
            outcome = StepOutcome(grad_norm=math.inf, action="skipped")
        elif coefficient < 1.0:  # torch.nn.utils.clip_grad_norm_ clamps at 1
            self.target.redo_clipped(snapshot, coefficient)
            outcome = StepOutcome(grad_norm=norm, action="clipped")
        else:
            outcome = StepOutcome(grad_norm=norm, action="accepted")
        self.target.finish()
        self.history.append(outcome)
        return outcome

    def _wait(self, work, index: int) -> None:
        if work.wait(timeout=datetime.timedelta(seconds=self.config.timeout_s)) is False:
            raise TimeoutError(f"post-validation: the global gradient state (reduction "
                               f"{index + 1} of {len(self.groups)}) did not arrive within "
                               f"{self.config.timeout_s}s from the other ranks")
