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
from ..megatron.context_parallel import CP_COMM_TYPES, cp_position_ids, cp_split

__all__ = ["context_parallel_problems", "cp_pad_multiple", "split_microbatch",
           "ContextParallelMicrobatch"]

MEGATRON_CP_COMM_TYPES = ("p2p", "a2a", "allgather", "a2a+p2p")
"""Megatron's --cp-comm-type values; odc-pp implements :data:`CP_COMM_TYPES`."""


def context_parallel_problems(args) -> list[str]:
    """What --context-parallel-size N > 1 does not combine with (one message per flag);
    [] for N = 1."""
    parallel, model = args.parallel, args.model
    cp, comm = parallel.context_parallel_size, parallel.cp_comm_type
    if comm not in MEGATRON_CP_COMM_TYPES:
        return [f"--cp-comm-type {comm!r} is not one of {MEGATRON_CP_COMM_TYPES}"]
    if cp < 1:
        return [f"--context-parallel-size must be >= 1, got {cp}"]
    if cp == 1:
        return ["--dynamic-context-parallel needs --context-parallel-size > 1"] \
            if parallel.dynamic_context_parallel else []
    problems = []
    if comm not in CP_COMM_TYPES:
        problems.append(f"--cp-comm-type {comm} is not implemented: use one of "
                        f"{CP_COMM_TYPES}")
    if parallel.mode.is_hierarchical:
        problems.append(f"--context-parallel-size {cp} needs --dp-mode odc or collective "
                        f"(the gradients are summed over dp x cp)")
    if parallel.dynamic_context_parallel and not (
            args.data.load_balance == "lb-mini" and args.data.max_tokens_per_microbatch
            and not args.data.no_pack_sequences and parallel.mode.is_odc):
        problems.append("--dynamic-context-parallel needs --load-balance lb-mini with packed "
                        "rows (no --no-pack-sequences), --max-tokens-per-microbatch and "
                        "--dp-mode odc (the replicas' slot counts differ)")
    if parallel.cp_comm_type == "a2a":
        heads = model.num_attention_heads // parallel.tensor_model_parallel_size
        groups = (model.num_query_groups or model.num_attention_heads) // \
            parallel.tensor_model_parallel_size
        if heads % cp or groups % cp:
            problems.append(f"--cp-comm-type a2a needs the attention heads ({heads}) and "
                            f"query groups ({groups}) per tensor-parallel rank divisible "
                            f"by --context-parallel-size {cp}")
    return problems


def cp_pad_multiple(*, context_parallel_size: int, multiple: int = 1) -> int:
    """The multiple microbatch lengths are padded to: ``multiple`` (sequence
    parallelism's) and 2 x CP (the load-balanced split's chunk count)."""
    if context_parallel_size == 1:
        return multiple
    return math.lcm(multiple, 2 * context_parallel_size)


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
