"""Learning-rate schedule: linear warmup, then constant / linear / cosine decay to min-lr."""

from __future__ import annotations

import math
from dataclasses import dataclass

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

    def __post_init__(self) -> None:
        if self.style not in ("constant", "linear", "cosine"):
            raise ValueError(f"--lr-decay-style {self.style!r}: use constant, linear or cosine")
        if not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"--min-lr {self.min_lr} must be in [0, --lr {self.lr}]")
        if self.warmup_iters < 0 or self.decay_iters < 1:
            raise ValueError("--lr-warmup-iters must be >= 0 and --lr-decay-iters >= 1")

    def lr_at(self, iteration: int) -> float:
        if iteration < self.warmup_iters:
            return self.lr * (iteration + 1) / self.warmup_iters
        if self.style == "constant":
            return self.lr
        span = max(1, self.decay_iters - self.warmup_iters)
        progress = min(1.0, (iteration - self.warmup_iters) / span)
        if self.style == "linear":
            factor = 1.0 - progress
        else:
            factor = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_lr + (self.lr - self.min_lr) * factor
