"""A step's learning rate with a second, decoupled rate attached (Megatron's
``--decoupled-lr``: the embedding and output-layer parameters follow their own schedule).

:class:`StepRates` *is* the main rate (a ``float``), so everything that passes a step's
rate along (the trainer, the runtime, the post-validator) carries both rates unchanged;
only the optimizer reads :func:`decoupled_rate`. A plain float means one rate for all.
"""

from __future__ import annotations

__all__ = ["StepRates", "decoupled_rate"]


class StepRates(float):
    """The main learning rate of a step (its float value) and, in :attr:`decoupled`, the
    rate of the parameters with a decoupled schedule."""

    decoupled: float

    def __new__(cls, lr: float, decoupled: float) -> "StepRates":
        rates = super().__new__(cls, lr)
        rates.decoupled = float(decoupled)
        return rates

    def __reduce__(self):
        return StepRates, (float(self), self.decoupled)

    def __repr__(self) -> str:
        return f"StepRates({float(self)!r}, decoupled={self.decoupled!r})"


def decoupled_rate(lr: float) -> float:
    """The rate of the decoupled parameters: ``lr.decoupled`` of a :class:`StepRates`,
    else ``lr`` itself."""
    return lr.decoupled if isinstance(lr, StepRates) else lr
