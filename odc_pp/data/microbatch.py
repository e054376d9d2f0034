"""Microbatch container handed to the pipeline runtime (one per microbatch, on every rank)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Microbatch", "count_tokens", "row_token_ids"]


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
    position_ids: torch.Tensor | None = None
    """``[batch, seq]`` int64 positions for rotary/learned embeddings; None: ``0..seq-1`` in
    every row. With packing, each packed sample restarts at 0."""
    segment_ids: torch.Tensor | None = None
    """``[batch, seq]`` int64 id of the packed sample each position belongs to (0, 1, 2, ...
    within a row; padding is -1). None: one sample per row. Attention is causal *within* a
    segment only: query i sees key j iff ``segment_ids[b, i] == segment_ids[b, j] >= 0`` and
    ``j <= i``. (The contract between ``odc_pp.data`` packing and the model's attention.)"""
    global_token_ids: torch.Tensor | None = None
    """``[batch, seq]`` int64 identity of each position in the whole run: its global sample
    index ``<< 32 | `` its offset in that sample (padding: -1). The model's dropout masks
    are keyed by it (:mod:`odc_pp.megatron.dropout`), so they do not depend on the layout;
    None: unknown (dropout > 0 then refuses)."""

    def __post_init__(self) -> None:
        if self.tokens.dim() != 2:
            raise ValueError(f"tokens must be [batch, seq], got shape {tuple(self.tokens.shape)}")
        for name in ("labels", "loss_mask", "position_ids", "segment_ids",
                     "global_token_ids"):
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
                          loss_mask=move(self.loss_mask), position_ids=move(self.position_ids),
                          segment_ids=move(self.segment_ids),
                          global_token_ids=move(self.global_token_ids))


def count_tokens(microbatches: list[Microbatch]) -> int:
    return sum(mb.num_tokens for mb in microbatches)


def row_token_ids(batch: int, seq: int, *, first_sample: int = 0) -> torch.Tensor:
    """``global_token_ids`` of ``batch`` rows holding one whole sample each (samples
    ``first_sample``, ``first_sample + 1``, ...; offsets ``0..seq-1``): for microbatches
    made outside the data plan (dry runs, benchmarks, tests)."""
    samples = torch.arange(first_sample, first_sample + batch, dtype=torch.int64)
    return (samples.unsqueeze(1) << 32) + torch.arange(seq, dtype=torch.int64)
