"""The checks of ``--context-parallel-size`` and its companion flags, torch-free so that
``pretrain_gpt.py`` reports bad flags before importing torch (the split of a microbatch
over context-parallel ranks is :mod:`.context_split`)."""

from __future__ import annotations

__all__ = ["MEGATRON_CP_COMM_TYPES", "context_parallel_problems"]

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
    if parallel.mode.is_hierarchical:
        problems.append(f"--context-parallel-size {cp} needs --dp-mode odc or collective "
                        f"(the gradients are summed over dp x cp)")
    if parallel.dynamic_context_parallel and not (
            args.data.load_balance == "lb-mini" and args.data.max_tokens_per_microbatch
            and not args.data.no_pack_sequences and parallel.mode.is_odc):
        problems.append("--dynamic-context-parallel needs --load-balance lb-mini with packed "
                        "rows (no --no-pack-sequences), --max-tokens-per-microbatch and "
                        "--dp-mode odc (the replicas' slot counts differ)")
    if getattr(model, "attention_dropout", 0.0):
        problems.append(f"--context-parallel-size {cp} needs --attention-dropout 0")
    if parallel.cp_comm_type == "a2a":
        heads = model.num_attention_heads // parallel.tensor_model_parallel_size
        groups = (model.num_query_groups or model.num_attention_heads) // \
            parallel.tensor_model_parallel_size
        if heads % cp or groups % cp:
            problems.append(f"--cp-comm-type a2a needs the attention heads ({heads}) and "
                            f"query groups ({groups}) per tensor-parallel rank divisible "
                            f"by --context-parallel-size {cp}")
    return problems
