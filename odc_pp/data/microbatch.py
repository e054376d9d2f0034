"""Microbatch container handed to the pipeline runtime (one per microbatch, on every rank)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Microbatch", "count_tokens"]


@dataclass(kw_only=True)
class Microbatch:
    """Token ids and targets of one microbatch; sequence length may differ per microbatch.

    Ranks that run neither the first nor the last stage may pass ``tokens`` only for its
    shape bookkeeping; activations carry their own shape between ranks.
    """

    tokens: torch.Tensor
    """Input token ids, ``[batch, seq]`` int64."""
    labels: torch.Tensor | None = None
    """Target ids ``[batch, seq]``; needed where the last stage runs."""
    loss_mask: torch.Tensor | None = None
    """``[batch, seq]`` 0/1 weights of token losses; None: every token counts."""

    def __post_init__(self) -> None:
        if self.tokens.dim() != 2:
            raise ValueError(f"tokens must be [batch, seq], got shape {tuple(self.tokens.shape)}")
        for name in ("labels", "loss_mask"):
            value = getattr(self, name)
            if value is not None and value.shape != self.tokens.shape:
                raise ValueError(f"{name} shape {tuple(value.shape)} != tokens shape "
                                 f"{tuple(self.tokens.shape)}")

    @property
    def num_tokens(self) -> int:
        """Tokens that count in the loss."""
        if self.loss_mask is None:
            return self.tokens.numel()
        return int(self.loss_mask.sum().item())

    def to(self, device: torch.device | str) -> "Microbatch":
        move = (lambda t: None if t is None else t.to(device))
        return Microbatch(tokens=move(self.tokens), labels=move(self.labels),
                          loss_mask=move(self.loss_mask))


def count_tokens(microbatches: list[Microbatch]) -> int:
    return sum(mb.num_tokens for mb in microbatches)
