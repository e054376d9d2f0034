"""Loss scaling for fp16 training: megatron-core's constant and dynamic grad scalers.

The training loop multiplies the loss by :attr:`LossScaler.scale` before backward, divides
the (fp32-accumulated) gradients by it before the global gradient state is reduced
(:mod:`odc_pp.optim.clip`: one reduction gives the norm and the inf/nan flag of every
rank), skips the step when that state is not finite and then calls
:meth:`LossScaler.update` with the same global flag on every rank, so the scale stays
identical everywhere.

:class:`DynamicLossScaler` is megatron-core's ``DynamicGradScaler``
(``megatron/core/optimizer/grad_scaler.py``) with Megatron-LM's arguments: every
overflow resets the growth count and lowers the hysteresis count; once the hysteresis
count is used up, each overflow multiplies the scale by ``backoff_factor`` (not below
``min_scale``); ``growth_interval`` clean steps in a row multiply it by ``growth_factor``
and restore the hysteresis count. The scale is kept as a float32 number, as megatron-core
keeps it in a float32 tensor, so the sequence of scales is the same bit for bit.
A bottom layer: it imports torch only, on first use of a scaler (the flag checks build
:class:`LossScaleConfig` before torch is imported).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LossScaleConfig", "LossScaler", "ConstantLossScaler", "DynamicLossScaler",
           "build_loss_scaler"]


@dataclass(kw_only=True)
class LossScaleConfig:
    """Megatron-LM's loss-scale flags (``--loss-scale`` etc.)."""

    loss_scale: float | None = None
    """A constant scale; None: dynamic scaling."""
    initial_scale: float = 2.0 ** 32
    """The dynamic scale's start (Megatron's --initial-loss-scale)."""
    min_scale: float = 1.0
    """The dynamic scale's floor (--min-loss-scale)."""
    growth_interval: int = 1000
    """Clean steps in a row before the dynamic scale doubles (--loss-scale-window)."""
    hysteresis: int = 2
    """Overflows in a row before the dynamic scale halves (--hysteresis)."""
    growth_factor: float = 2.0
    """Factor of a raise (Megatron: 2)."""
    backoff_factor: float = 0.5
    """Factor of a cut (Megatron: 0.5)."""

    def __post_init__(self) -> None:
        problems = []
        if self.loss_scale is not None and not self.loss_scale > 0:
            problems.append(f"--loss-scale must be > 0, got {self.loss_scale}")
        if not 0 < self.min_scale <= self.initial_scale:
            problems.append(f"--min-loss-scale {self.min_scale} must be > 0 and at most "
                            f"--initial-loss-scale {self.initial_scale}")
        if self.growth_interval < 1:
            problems.append(f"--loss-scale-window must be >= 1, got {self.growth_interval}")
        if self.hysteresis < 1:
            problems.append(f"--hysteresis must be >= 1, got {self.hysteresis}")
        if not self.growth_factor > 1 or not 0 < self.backoff_factor < 1:
            problems.append("the growth factor must be > 1 and the backoff factor in (0, 1)")
        if problems:
            raise ValueError("; ".join(problems))


def _float32(value: float) -> float:
    import torch

    return float(torch.tensor(value, dtype=torch.float32))


class LossScaler:
    """The scale the loss is multiplied by; :meth:`update` after every step."""

    dynamic = False
    """The scale changes with overflows."""

    def __init__(self, scale: float) -> None:
        if not scale > 0:
            raise ValueError(f"the loss scale must be > 0, got {scale}")
        self.scale = _float32(scale)

    @property
    def inv_scale(self) -> float:
        """``1 / scale`` rounded to float32 (megatron-core's ``inv_scale``)."""
        return _float32(1.0 / self.scale)

    def update(self, found_inf: bool) -> None:
        """After a step: ``found_inf`` is the global inf/nan flag of the gradients."""

    def state_dict(self) -> dict:
        return {"scale": self.scale}

    def load_state_dict(self, state: dict) -> None:
        self.scale = _float32(state["scale"])


class ConstantLossScaler(LossScaler):
    """Megatron's --loss-scale: the scale never changes (overflowing steps are still
    skipped)."""


class DynamicLossScaler(LossScaler):
    """megatron-core's ``DynamicGradScaler`` (module docstring)."""

    dynamic = True

    def __init__(self, config: LossScaleConfig) -> None:
        super().__init__(config.initial_scale)
        self.config = config
        self.min_scale = _float32(config.min_scale)
        self.growth_tracker = 0
        """Clean steps since the last overflow or raise."""
        self.hysteresis_tracker = config.hysteresis
        """Overflows still tolerated before the scale is cut."""

    def update(self, found_inf: bool) -> None:
        config = self.config
        if found_inf:
            self.growth_tracker = 0
            self.hysteresis_tracker -= 1
            if self.hysteresis_tracker <= 0:
                self.scale = max(_float32(self.scale * _float32(config.backoff_factor)),
                                 self.min_scale)
        else:
            self.growth_tracker += 1
            if self.growth_tracker == config.growth_interval:
                self.growth_tracker = 0
                self.hysteresis_tracker = config.hysteresis
                self.scale = _float32(self.scale * _float32(config.growth_factor))

    @property
    def at_floor(self) -> bool:
        """The scale cannot be lowered further."""
        return self.scale <= self.min_scale

    def state_dict(self) -> dict:
        return {"scale": self.scale, "growth_tracker": self.growth_tracker,
                "hysteresis_tracker": self.hysteresis_tracker}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.growth_tracker = int(state["growth_tracker"])
        self.hysteresis_tracker = int(state["hysteresis_tracker"])


def build_loss_scaler(config: LossScaleConfig) -> LossScaler:
    """Constant with ``config.loss_scale``, else dynamic (Megatron's choice)."""
    if config.loss_scale is not None:
        return ConstantLossScaler(config.loss_scale)
    return DynamicLossScaler(config)
