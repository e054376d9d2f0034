"""Learning-rate schedule: linear warmup, then constant / linear / cosine decay to min-lr;
optionally a second, decoupled schedule of the same shape for the embedding and output
layer (Megatron's --decoupled-lr / --decoupled-min-lr)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from odc_pp.optim.rates import StepRates

__all__ = ["LRSchedule"]


@dataclass(kw_only=True)
class LRSchedule:
    """``lr_at(i)`` is the rate of iteration ``i`` (0-based) -- a pure function, so a
    resumed run needs nothing but the iteration number."""

    lr: float
    """Peak rate, reached at the end of warmup."""
    min_lr: float = 0.0
    """Rate at and after the end of decay."""
    warmup_iters: int = 0
    """Linear warmup from lr/warmup_iters (iteration 0) to lr."""
    decay_iters: int = 1
    """Iteration where decay ends (counted from 0, including warmup)."""
    style: str = "cosine"
    """'constant', 'linear' or 'cosine'."""
    decoupled_lr: float | None = None
    """Peak rate of the decoupled parameters (embedding and output layer; Megatron's
    --decoupled-lr), same warmup and decay; None: they follow ``lr``."""
    decoupled_min_lr: float | None = None
    """Final rate of the decoupled schedule (--decoupled-min-lr); None: ``min_lr``."""

    def __post_init__(self) -> None:
        if self.style not in ("constant", "linear", "cosine"):
            raise ValueError(f"--lr-decay-style {self.style!r}: use constant, linear or cosine")
        if not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"--min-lr {self.min_lr} must be in [0, --lr {self.lr}]")
        if self.warmup_iters < 0 or self.decay_iters < 1:
            raise ValueError("--lr-warmup-iters must be >= 0 and --lr-decay-iters >= 1")
        if self.decoupled_lr is None:
            if self.decoupled_min_lr is not None:
                raise ValueError("--decoupled-min-lr needs --decoupled-lr (Megatron ignores "
                                 "it alone)")
        elif not 0 <= self.decoupled_floor <= self.decoupled_lr:
            raise ValueError(f"--decoupled-min-lr (default --min-lr) {self.decoupled_floor} "
                             f"must be in [0, --decoupled-lr {self.decoupled_lr}]")

    @property
    def decoupled_floor(self) -> float:
        """Final rate of the decoupled schedule: ``decoupled_min_lr``, else ``min_lr``."""
        return self.min_lr if self.decoupled_min_lr is None else self.decoupled_min_lr

    def lr_at(self, iteration: int) -> float:
        """The rate of iteration ``iteration``; with ``decoupled_lr`` a
        :class:`~odc_pp.optim.rates.StepRates` that also carries the decoupled rate."""
        lr = self._rate(iteration, self.lr, self.min_lr)
        if self.decoupled_lr is None:
            return lr
        return StepRates(lr, self._rate(iteration, self.decoupled_lr, self.decoupled_floor))

    def _rate(self, iteration: int, peak: float, floor: float) -> float:
        if iteration < self.warmup_iters:
            return peak * (iteration + 1) / self.warmup_iters
        if self.style == "constant":
            return peak
        span = max(1, self.decay_iters - self.warmup_iters)
        progress = min(1.0, (iteration - self.warmup_iters) / span)
        if self.style == "linear":
            factor = 1.0 - progress
        else:
            factor = 0.5 * (1.0 + math.cos(math.pi * progress))
        return floor + (peak - floor) * factor
