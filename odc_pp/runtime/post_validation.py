"""Optimizer post-validation: step eagerly, validate when the global state arrives.

``step()`` starts a non-blocking all-reduce of this rank's (squared grad norm, non-finite
flag) over ``group`` (every pipeline stage, and data-parallel shards if grads are
sharded), snapshots what a rollback needs and steps the wrapped optimizer at once, so no
stage waits for the others at the end of a minibatch. ``validate()`` (the schedule's
POST_VALIDATION action, or the start of the next minibatch) waits for the reduction and:

* any inf/NaN gradient on any stage: restore parameters and optimizer state (the step
  is skipped everywhere, as a synchronous inf check would do);
* global norm above ``max_grad_norm``: restore, scale the saved gradients by
  ``max_grad_norm / (norm + eps)`` and step again (identical to synchronous clipping);
* otherwise keep the eager step.

Rollback restores exact copies, so it is bit-exact in fp32, bf16 and fp16 and works with
any torch optimizer (AdamW included). The price is one copy of parameters, gradients and
optimizer state, held from ``step()`` to ``validate()``.
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass
from typing import Iterable

import torch
import torch.distributed as dist

__all__ = ["PostValidationConfig", "PostValidatedOptimizer", "StepOutcome",
           "global_grad_norm_sq"]


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


class PostValidatedOptimizer:
    """Wraps a torch optimizer with eager steps and deferred global validation."""

    def __init__(self, config: PostValidationConfig, *, optimizer: torch.optim.Optimizer,
                 group=None, device: torch.device | str = "cpu") -> None:
        self.config = config
        self.optimizer = optimizer
        self.group = group
        self.device = torch.device(device)
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        self._pending = None
        self.history: list[StepOutcome] = []

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        """Start the global grad-state reduction, snapshot, and step eagerly."""
        if self._pending is not None:
            self.validate()
        norm_sq, finite = global_grad_norm_sq(self.params)
        state = torch.tensor([0.0 if not finite else norm_sq, 0.0 if finite else 1.0],
                             dtype=torch.float64, device=self.device)
        work = dist.all_reduce(state, group=self.group, async_op=True)
        snapshot = self._snapshot()
        self.optimizer.step()
        self._pending = (work, state, snapshot)

    def validate(self) -> StepOutcome | None:
        """Finish the pending step (see module docstring); None if nothing is pending."""
        if self._pending is None:
            return None
        work, state, snapshot = self._pending
        self._pending = None
        if work.wait(timeout=datetime.timedelta(seconds=self.config.timeout_s)) is False:
            raise TimeoutError("post-validation: global gradient state did not arrive within "
                               f"{self.config.timeout_s}s from the other stages")
        norm_sq, nonfinite = state.tolist()
        if nonfinite > 0:
            self._restore(snapshot, with_grads=False)
            outcome = StepOutcome(grad_norm=math.inf, action="skipped")
        elif self.config.max_grad_norm is not None and \
                math.sqrt(norm_sq) > self.config.max_grad_norm:
            norm = math.sqrt(norm_sq)
            current_grads = [p.grad for p in self.params]  # may already be the next step's
            self._restore(snapshot, with_grads=True)
            coefficient = self.config.max_grad_norm / (norm + self.config.eps)
            for param in self.params:
                if param.grad is not None:
                    param.grad.mul_(coefficient)
            self.optimizer.step()
            for param, grad in zip(self.params, current_grads):
                param.grad = grad
            outcome = StepOutcome(grad_norm=norm, action="clipped")
        else:
            outcome = StepOutcome(grad_norm=math.sqrt(norm_sq), action="accepted")
        self.history.append(outcome)
        return outcome

    # ----- snapshot --------------------------------------------------------------
    def _snapshot(self) -> dict:
        return {
            "params": [p.detach().clone() for p in self.params],
            "grads": [None if p.grad is None else p.grad.detach().clone() for p in self.params],
            "state": [{k: (v.clone() if torch.is_tensor(v) else v)
                       for k, v in self.optimizer.state.get(p, {}).items()}
                      for p in self.params],
        }

    @torch.no_grad()
    def _restore(self, snapshot: dict, *, with_grads: bool) -> None:
        for index, param in enumerate(self.params):
            param.copy_(snapshot["params"][index])
            saved_state = snapshot["state"][index]
            if saved_state:
                self.optimizer.state[param] = saved_state
            else:
                self.optimizer.state.pop(param, None)
            if with_grads:
                param.grad = snapshot["grads"][index]
