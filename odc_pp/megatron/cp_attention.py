"""The core attention of context parallelism: megatron's ``DotProductAttention``
interface over ring attention (:func:`odc_pp.megatron.context_parallel.ring_attention`)
or all-to-all (:func:`~odc_pp.megatron.context_parallel.ulysses_attention`),
kept apart from :mod:`odc_pp.megatron.context_parallel` so the layout and the ring import
without megatron-core."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from megatron.core.transformer.dot_product_attention import DotProductAttention

from .context_parallel import (CP_COMM_TYPES, LocalRows, cp_token_indices, ring_attention,
                               ulysses_attention)
from .dropout import attention_keys
from .packed_attention import PackedSegments

__all__ = ["ContextParallelDotProductAttention"]


class ContextParallelDotProductAttention(DotProductAttention):
    """Megatron's core attention interface over a context-parallel group: ``forward(query,
    key, value, attention_mask, ...)`` with ``[s/N, b, heads, dim]`` inputs holding this
    rank's two load-balanced chunks; returns ``[s/N, b, heads * dim]``.

    The group: ``cp_group`` if given (a ``functools.partial`` keyword in a layer spec),
    else ``pg_collection.cp`` (what megatron hands every core attention).
    ``cp_comm_type``: ``p2p`` (ring; None means p2p) or ``a2a`` (Ulysses; heads and K/V
    heads divisible by the CP size); ``comm_type``, when given, wins over it (a layer
    spec's ``functools.partial`` keyword: megatron passes its own ``cp_comm_type``). ``attention_mask``: None (causal)
    or :class:`~odc_pp.megatron.packed_attention.PackedSegments` of the *full* rows
    (``[b, s]`` segment ids). Attention dropout is keyed by the data
    (:mod:`odc_pp.megatron.dropout`), the same masks as without context parallelism. No
    attention bias, softmax offset or ``PackedSeqParams`` (each one a ValueError)."""

    def __init__(self, config, layer_number, attn_mask_type, attention_type,
                 attention_dropout=None, softmax_scale=None, cp_comm_type=None,
                 pg_collection=None, cp_group=None, comm_type=None):
        cp_comm_type = comm_type or cp_comm_type
        if cp_comm_type not in (None,) + CP_COMM_TYPES:
            raise ValueError(f"--cp-comm-type must be one of {CP_COMM_TYPES}, got "
                             f"{cp_comm_type!r}")
        if getattr(config, "context_parallel_size", 1) != 1:
            # megatron's parent refuses CP (only its TE attention has it); the ring is here
            config = copy.copy(config)
            config.context_parallel_size = 1
        super().__init__(config, layer_number, attn_mask_type, attention_type,
                         attention_dropout=attention_dropout, softmax_scale=softmax_scale,
                         pg_collection=pg_collection)
        self.cp_group = cp_group if cp_group is not None else self.pg_collection.cp
        self.cp_comm_type = cp_comm_type or "p2p"
        if self.softmax_offset is not None:
            raise ValueError("context-parallel attention supports softmax_type vanilla "
                             "only")
        coeff = self.scale_mask_softmax.scale
        self.cp_scale = self.softmax_scale * (coeff if coeff is not None else 1.0)

    def forward(self, query, key, value, attention_mask, attn_mask_type=None,
                attention_bias=None, packed_seq_params=None):
        if packed_seq_params is not None or attention_bias is not None:
            raise ValueError("context-parallel attention takes packed rows as "
                             "PackedSegments of the full rows, and no attention bias")
        group = self.cp_group
        seq_q, batch = query.shape[0], query.shape[1]
        segment_ids = None
        if isinstance(attention_mask, LocalRows):  # a lane slot: this rank's rows alone
            group, segment_ids, attention_mask = None, attention_mask.segment_ids, None
        size = 1 if group is None else dist.get_world_size(group)
        if isinstance(attention_mask, PackedSegments):
            segment_ids = attention_mask.segment_ids
            if tuple(segment_ids.shape) != (batch, seq_q * size):
                raise ValueError(f"PackedSegments must describe the full rows "
                                 f"[{batch}, {seq_q * size}], got "
                                 f"{tuple(segment_ids.shape)}")
        elif attention_mask is not None:
            raise ValueError("context-parallel attention takes None (causal) or "
                             "PackedSegments, not a dense mask")
        # [s, b, n, d] -> [b, n, s, d]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        ring = self.cp_comm_type == "p2p" or group is None
        context = (ring_attention if ring else ulysses_attention)(
            q, k, v, group=group, scale=self.cp_scale, segment_ids=segment_ids,
            dropout=self._dropout_keys(q.shape[1], None if ring else group, seq_q * size))
        return context.permute(2, 0, 1, 3).reshape(seq_q, batch,
                                                   self.hidden_size_per_partition)

    def _dropout_keys(self, heads: int, a2a_group, seq: int):
        """The keyed attention dropout (:mod:`odc_pp.megatron.dropout`) of this call:
        None without dropout; the ring keys this rank's queries against the whole rows'
        keys, the all-to-all (``a2a_group``) its heads over the gathered sequence."""
        if not (self.training and self.attention_dropout.p > 0):
            return None
        prob = self.attention_dropout.p
        if a2a_group is None:
            return attention_keys(prob, heads)
        size, rank = dist.get_world_size(a2a_group), dist.get_rank(a2a_group)
        order = torch.cat([cp_token_indices(seq, r, size) for r in range(size)])
        return attention_keys(prob, heads // size, cp_rank=rank, cp_size=size, order=order)
