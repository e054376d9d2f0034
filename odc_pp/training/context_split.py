"""Context parallelism in training: the flags' checks and each CP rank's share of a
microbatch.

Every CP rank of a data-parallel replica plans and reads the same microbatches (the
planner knows dp only); before the runtime sees them, :func:`split_microbatch` keeps this
rank's tokens, labels, loss mask and position ids with the load-balanced layout of
:mod:`odc_pp.megatron.context_parallel` (rank ``i`` holds chunks ``i`` and
``2N - 1 - i``). Positions are made explicit (``0..s-1`` when the microbatch has none)
before the split, so RoPE and learned positions see each token's global position. The
loss needs nothing new: each rank's per-token losses are divided by the global token
count (the runtime's ``global_num_tokens``), the logged loss sums every rank's part, and
the gradients are summed over dp x cp.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..data.microbatch import Microbatch
from ..megatron.context_parallel import cp_position_ids, cp_split
from .context_checks import (MEGATRON_CP_COMM_TYPES, context_parallel_problems,
                             cp_pad_multiple, padded_length_problems)

__all__ = ["MEGATRON_CP_COMM_TYPES", "context_parallel_problems", "cp_pad_multiple",
           "padded_length_problems", "split_microbatch", "ContextParallelMicrobatch"]


@dataclass(kw_only=True)
class ContextParallelMicrobatch(Microbatch):
    """A CP rank's part of a microbatch: tokens, labels, loss mask and position ids hold
    this rank's load-balanced ``seq / N`` positions, ``segment_ids`` is None."""

    full_segment_ids: torch.Tensor | None = None
    """Packed rows: the ``[batch, seq]`` segment ids of the *whole* rows, which the
    context-parallel attention masks every (query chunk, key chunk) pair with
    (:class:`~odc_pp.megatron.cp_attention.ContextParallelDotProductAttention`); None: one
    sample per row (causal)."""
    full_global_token_ids: torch.Tensor | None = None
    """The whole rows' ``global_token_ids``: the keys of the attention dropout's masks
    for the other ranks' key chunks (:mod:`odc_pp.megatron.dropout`)."""


def split_microbatch(microbatch: Microbatch, rank: int, size: int) -> Microbatch:
    """Rank ``rank`` of ``size`` CP ranks' part of ``microbatch`` (the same object for
    size 1): a :class:`ContextParallelMicrobatch`."""
    if size == 1:
        return microbatch
    batch, seq = microbatch.tokens.shape
    positions = microbatch.position_ids
    if positions is None:
        positions = torch.arange(seq, dtype=torch.int64).unsqueeze(0).expand(batch, seq)

    def part(tensor):
        return None if tensor is None else cp_split(tensor, rank, size, dim=1)

    return ContextParallelMicrobatch(
        tokens=part(microbatch.tokens), labels=part(microbatch.labels),
        loss_mask=part(microbatch.loss_mask),
        position_ids=cp_position_ids(positions, rank, size).contiguous(),
        global_token_ids=part(microbatch.global_token_ids),
        full_global_token_ids=microbatch.global_token_ids,
        full_segment_ids=microbatch.segment_ids)
