"""The checks of ``--context-parallel-size`` and its companion flags, torch-free so that
``pretrain_gpt.py`` reports bad flags before importing torch (the split of a microbatch
over context-parallel ranks is :mod:`.context_split`)."""

from __future__ import annotations

import math

__all__ = ["MEGATRON_CP_COMM_TYPES", "context_parallel_problems", "cp_pad_multiple",
           "padded_length_problems"]

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
    from odc_pp.megatron.context_parallel import CP_COMM_TYPES  # torch: only when cp > 1

    problems = []
    if comm not in CP_COMM_TYPES:
        problems.append(f"--cp-comm-type {comm} is not implemented: use one of "
                        f"{CP_COMM_TYPES}")
    if parallel.dynamic_context_parallel and not (
            args.data.load_balance == "lb-mini" and args.data.max_tokens_per_microbatch
            and not args.data.no_pack_sequences):
        problems.append("--dynamic-context-parallel needs --load-balance lb-mini with packed "
                        "rows (no --no-pack-sequences) and --max-tokens-per-microbatch "
                        "(and --dp-mode odc: the replicas' slot counts differ)")
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


def padded_length_problems(args) -> list[str]:
    """--seq-length that context or sequence parallelism pads past the learned position
    table (a position id beyond --max-position-embeddings): refused with the nearest valid
    lengths, as Megatron refuses lengths these splits cannot divide. [] otherwise (RoPE has
    no table)."""
    parallel, model = args.parallel, args.model
    cp, tp = parallel.context_parallel_size, parallel.tensor_model_parallel_size
    if cp < 1 or tp < 1 or model.position_embedding_type != "learned_absolute":
        return []
    sp = parallel.sequence_parallel and tp > 1
    multiple = cp_pad_multiple(context_parallel_size=cp, multiple=tp if sp else 1)
    seq, table = model.seq_length, model.max_position_embeddings or model.seq_length
    padded = -(-seq // multiple) * multiple
    if padded <= table:
        return []
    why = " and ".join(
        ([f"--context-parallel-size {cp} splits every sequence into 2 x {cp} chunks"]
         if cp > 1 else []) +
        ([f"--sequence-parallel splits it over --tensor-model-parallel-size {tp}"]
         if sp else []))
    lengths = [n for n in (padded - multiple, padded)
               if n >= multiple and n <= (model.max_position_embeddings or n)]
    return [f"--seq-length {seq} is not a multiple of {multiple} ({why}): microbatches are "
            f"padded up to {padded} positions, past the learned position table "
            f"(--max-position-embeddings {table}). Give --seq-length "
            f"{' or '.join(map(str, lengths))} (the nearest multiples of {multiple}), "
            f"--max-position-embeddings {padded} or more, or --position-embedding-type rope"]
