"""The peak memory of a planned job, from the ``pretrain_gpt.py`` flags ``odc-pp plan``
prints, by the dry run's memory model (issue 33: one verdict on memory).

What the dry run (:mod:`.dry_run`) computes is computed the same way here: the flags are
parsed by ``pretrain_gpt.py``'s parser; the per-parameter state is
:func:`~odc_pp.planner.memory.state_bytes`; the per-microbatch quantities are placed
in time by :func:`~odc_pp.planner.memory.schedule_peak` on the lowered schedule the
runtime executes (:func:`.schedules.training_request`, the dry run's microbatch count and
cost model). With ``--context-parallel-size N`` a rank's microbatch is 1/N of the
tokens (activations / N) and the ODC group spans dp x N ranks (state sharded over it).
The two things the dry run measures on fake tensors are formulas here:

* the trainable elements of each local chunk (exact: the embedding and output layer
  vocabulary-parallel, the linear layers split over tp, norms replicated);
* the per-microbatch bytes of a chunk (:class:`~odc_pp.planner.memory.ChunkBytes`),
  per token; the layers' saved and W-held bytes are the planner's one activation model
  (:func:`~odc_pp.planner.memory.saved_bytes_per_token`): what the dry run measured for
  the layer's kind (:mod:`odc_pp.planner.layer_kinds`: GeLU or SwiGLU, LayerNorm or
  RMSNorm, learned or rotary positions, MHA or GQA, flash or unfused attention, dropout,
  each recompute option); full recompute by its groups (:func:`_layers_bytes`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from odc_pp.planner.memory import (ChunkBytes, UnitSizes, saved_bytes_per_token, schedule_peak,
                                   state_bytes)
from odc_pp.planner.model import ModelShape

if TYPE_CHECKING:
    from .arguments import TrainingArgs
    from .job import Job

__all__ = ["rank_peaks", "chunk_sizes", "layer_bytes",
           "chunk_params", "layer_params", "param_residency", "embedding_kept", "job_peaks", "job_costs",
           "replica_microbatches"]


def layer_params(model, *, tp: int) -> int:
    """Trainable elements of one transformer layer on one tensor-parallel rank."""
    h, ffn = model.hidden_size, model.ffn_hidden_size or 4 * model.hidden_size
    heads = model.num_attention_heads
    kv_channels = model.kv_channels or h // heads
    groups = model.num_query_groups or heads
    norm = h if model.normalization == "RMSNorm" else 2 * h
    bias = not model.disable_bias_linear
    qkv = h * (heads + 2 * groups) * kv_channels + (heads + 2 * groups) * kv_channels * bias
    proj = heads * kv_channels * h
    fc1 = h * ffn * (2 if model.swiglu else 1) + ffn * (2 if model.swiglu else 1) * bias
    fc2 = ffn * h
    split = qkv + proj + fc1 + fc2
    replicated = 2 * norm + 2 * h * bias
    if model.qk_layernorm:
        replicated += 2 * kv_channels * (2 if norm > h else 1)
    return split // tp + replicated


def chunk_params(model, *, layers: int, first: bool, last: bool, tp: int, pp_chunks: int,
                 vocab_size: int) -> int:
    """Trainable elements of one chunk of ``layers`` layers on one tensor-parallel rank
    (``model``: the parsed ModelArgs; ``pp_chunks``: pp x chunks, for the tied copy)."""
    h = model.hidden_size
    norm = h if model.normalization == "RMSNorm" else 2 * h
    total = layers * layer_params(model, tp=tp)
    vocab = -(-vocab_size // tp) * h
    if first:
        total += vocab
        if model.position_embedding_type == "learned_absolute":
            total += model.max_position_embeddings * h
    if last:
        total += norm
        if model.untie_embeddings or pp_chunks > 1:  # tied at pp x chunks > 1: a copy
            total += vocab
    return total


def layer_bytes(model, *, vocab_size: int, tp: int, sequence_parallel: bool = True,
                quantity: str = "saved", recompute: str | None = None) -> float:
    """Bytes per token one layer of ``model`` (the parsed ModelArgs) holds on one
    tensor-parallel rank, ``quantity`` saved or w_held: the planner's one activation model
    (:func:`~odc_pp.planner.memory.saved_bytes_per_token`, the measured table) for the
    layer kind the dry run builds (the GPU's attention: sdpa unless ``host``).
    ``recompute``: none/lgd/full (None: --recompute-lgd's)."""
    shape = ModelShape.of(model, vocab_size)
    return saved_bytes_per_token(
        shape, seq_length=model.seq_length, flash=model.attention_backend != "host",
        recompute=recompute or ("lgd" if model.recompute_lgd else "none"), tp=tp,
        sequence_parallel=sequence_parallel, quantity=quantity)


def _layers_bytes(model, layers: int, quantity: str, **kwargs) -> float:
    """Per token: ``layers`` layers of a chunk, full recompute's groups as the dry run
    builds them (uniform: each group of --recompute-num-layers keeps its input; block:
    the first --recompute-num-layers layers of the chunk keep theirs)."""
    plain = layer_bytes(model, quantity=quantity, **kwargs)
    if not model.recompute_full:
        return layers * plain
    full = layer_bytes(model, quantity=quantity, recompute="full", **kwargs)
    n = model.recompute_num_layers or 1
    if quantity == "w_held":  # every layer's linears, recomputed or not
        recomputed = layers if model.recompute_method == "uniform" else min(n, layers)
        return recomputed * full + (layers - recomputed) * plain
    if model.recompute_method == "uniform":
        return math.ceil(layers / n) * full
    return min(n, layers) * full + (layers - min(n, layers)) * plain


def chunk_sizes(model, *, tokens: int, layers: int, last: bool, tp: int,
                vocab_size: int, fused_loss: bool = False,
                sequence_parallel: bool = True) -> ChunkBytes:
    """Per-microbatch bytes of one chunk (the dry run's measured quantities) for a
    microbatch of ``tokens`` tokens, bf16 (module docstring). ``fused_loss``: the last
    chunk runs ``--fused-cross-entropy`` (the dry run's GPU default at tp = 1):
    :func:`_fused_loss_bytes` instead of the logits."""
    h, ffn = model.hidden_size, model.ffn_hidden_size or 4 * model.hidden_size
    kinds = dict(vocab_size=vocab_size, tp=tp, sequence_parallel=sequence_parallel)
    saved = 2 * h / tp + _layers_bytes(model, layers, "saved", **kinds)  # + the input
    w_held = _layers_bytes(model, layers, "w_held", **kinds)
    if last and fused_loss:
        return _fused_loss_bytes(tokens=tokens, saved=saved, w_held=w_held, h=h,
                                 vocab_size=vocab_size)
    if last:
        saved += (4 * vocab_size + 2 * h) / tp  # fp32 logits, final norm
        w_held += (2 * vocab_size + 2 * h) / tp
        transient_f = (6 if tp == 1 else 10) * vocab_size / tp  # vocab-parallel loss
        transient_b = 8 * vocab_size / tp
    else:
        transient_f, transient_b = 8 * h / tp, 6 * ffn / tp
    # during the B, W-held tensors accumulate while saved activations are freed: at its
    # end the chunk holds all of its W-held tensors (more than its saved activations
    # with --recompute-lgd) and the input gradient
    transient_b = max(transient_b, w_held - saved + 32 * h / tp)
    return ChunkBytes(saved=int(tokens * saved), w_held=int(tokens * w_held),
                      transient_f=int(tokens * transient_f),
                      transient_b=int(tokens * transient_b))


def _fused_loss_bytes(*, tokens: int, saved: float, w_held: float, h: int,
                      vocab_size: int) -> ChunkBytes:
    """The last chunk under ``--fused-cross-entropy`` (tp = 1, bf16;
    :mod:`odc_pp.megatron.linear_cross_entropy`): from F to B it holds ``held_bytes``
    (the input gradient, the output layer's ``V x h`` weight gradient, the per-token loss
    and weight) instead of the fp32 logits; in F, one token chunk's logits (compute dtype,
    their gradient written over them: ``chunk_transient_bytes``) beside the weight gradient being
    accumulated and the input gradient; in B, the scaled weight and input gradients. The
    output layer's weight gradient is computed in F, so W holds nothing for it."""
    from odc_pp.megatron.linear_cross_entropy import chunk_transient_bytes, held_bytes

    held = held_bytes(tokens, h, vocab_size, 2, 2)
    weight_grad, input_grad = vocab_size * h * 2, tokens * h * 2
    transient_f = chunk_transient_bytes(tokens, vocab_size, 2) + weight_grad + input_grad
    transient_b = max(weight_grad + input_grad, tokens * (w_held - saved + 32 * h))
    return ChunkBytes(saved=int(tokens * saved + held), w_held=int(tokens * w_held),
                      transient_f=int(transient_f), transient_b=int(transient_b))


_NO_MEMORY_EFFECT = ("--load-balance",)
"""Flags (with their value) the peak does not depend on (``--dp-mode`` does: ``ddp``
keeps the parameters replicated)."""
_CACHE: dict[tuple, tuple[float, ...]] = {}


def rank_peaks(flags: list[str] | tuple[str, ...], world_size: int, *,
               budget_bytes: float | None = None) -> list[float]:
    """Peak bytes of each pipeline rank (tp rank 0, dp rank 0) of the job ``flags`` on
    ``world_size`` GPUs, as the dry run of that rank with the budget ``budget_bytes``
    computes them (it resolves ``--odc-param-residency auto`` by the budget; None: no
    budget known, minibatch) (cached)."""
    flags = tuple(flags)
    key = (tuple(f for i, f in enumerate(flags) if f not in _NO_MEMORY_EFFECT and
                 (i == 0 or flags[i - 1] not in _NO_MEMORY_EFFECT)), world_size, budget_bytes)
    if key not in _CACHE:
        _CACHE[key] = _rank_peaks(flags, world_size, budget_bytes)
    return list(_CACHE[key])


def _rank_peaks(flags: tuple[str, ...], world_size: int,
                budget_bytes: float | None) -> tuple[float, ...]:
    from odc_pp.planner.verdict import memory_flags

    from .arguments import parse_args

    args = parse_args(memory_flags(flags))
    job = args.resolve(world_size, world_size)
    return job_peaks(job, param_residency(job, budget_bytes=budget_bytes))


def param_residency(job: Job, *, budget_bytes: float | None) -> str:
    """--odc-param-residency resolved for the ``job``: auto is layer where minibatch
    residency's plan exceeds ``budget_bytes`` on some pipeline rank (None: no budget
    known), else minibatch; every rank of the job resolves the same from the same
    flags."""
    chosen, layout = job.args.parallel.odc_param_residency, job.layout
    if chosen != "auto":
        return chosen
    if budget_bytes is None or layout.dp * layout.cp == 1 or \
            layout.mode.transport == "collective":
        return "minibatch"
    fits = max(job_peaks(job, "minibatch")) <= budget_bytes
    return "minibatch" if fits else "layer"


def embedding_kept(job: Job, residency: str, *, budget_bytes: float | None) -> bool:
    """Under ``layer`` residency, whether an untied embedding stays gathered from its first
    use to the step like the chunk's other kept parts (instead of gathered in every F,
    where nothing computes before it to hide its gather): where the memory plan with it
    kept fits ``budget_bytes`` on every pipeline rank (None: no budget known, not kept)."""
    if residency != "layer" or budget_bytes is None or job.args.model.vocab_size is None:
        return False
    return max(job_peaks(job, residency, keep_embedding=True)) <= budget_bytes


def job_peaks(job: Job, residency: str, *, keep_embedding: bool = False
              ) -> tuple[float, ...]:
    """Peak bytes of each pipeline rank of the resolved ``job`` (rank_peaks);
    ``keep_embedding``: layer residency keeps the embedding (:func:`embedding_kept`)."""
    from odc_pp.schedule.build import build

    args, layout = job.args, job.layout
    tp, pp, dp, chunks = layout.tp, layout.pp, layout.dp, job.num_chunks
    model, vocab = args.model, args.model.vocab_size
    if not vocab:
        raise ValueError("the plan's flags need --vocab-size (or --hf-checkpoint)")
    costs = job_costs(job)
    schedule = build(job.schedule.with_microbatches(replica_microbatches(args, dp)), costs)
    cp = layout.cp  # each rank holds 1/cp of every row
    tokens = (args.data.max_tokens_per_microbatch or
              args.data.micro_batch_size * model.seq_length) // cp
    counts = job.stage_layout.counts()  # decoder layers of each virtual stage
    tied = not model.untie_embeddings and pp * chunks > 1  # the output copy: out of the norm
    message = 2 * tokens * model.hidden_size // (tp if args.parallel.sequence_parallel else 1)
    # the dry run models a GPU job: --fused-cross-entropy auto is on there (never under tp)
    fused_loss = model.fused_cross_entropy != "off" and tp == 1
    peaks = []
    embedding = -(-vocab // tp) * model.hidden_size  # per use where untied (residency)
    for pp_rank in range(pp):
        stages = [schedule.stage_of(pp_rank, c) for c in range(chunks)]
        last = [s == schedule.num_stages - 1 for s in stages]
        per_use_embedding = [embedding if s == 0 and model.untie_embeddings
                             and not keep_embedding else 0 for s in stages]
        gathered_per_use = [counts[s] * layer_params(model, tp=tp) + e
                            for s, e in zip(stages, per_use_embedding)]
        params = tuple(chunk_params(model, layers=counts[s], first=s == 0, last=is_last, tp=tp,
                                    pp_chunks=pp * chunks, vocab_size=vocab)
                       for s, is_last in zip(stages, last))
        units = UnitSizes(unit_params=params, dp=dp * cp, param_bytes=2 if model.bf16 or model.fp16 else 4,
                          deterministic=not args.parallel.nondeterministic_dp,
                          local_grads=_local_grads(args, layout.mode, dp * cp),
                          main_grad_bytes=_main_grad_bytes(args, layout.mode),
                          gathered_params=None if residency != "layer" else tuple(
                              p - per_use for p, per_use in zip(params, gathered_per_use)),
                          shard_params=None if residency != "layer" else tuple(
                              _layer_shard(p, counts[s], layer_params(model, tp=tp),
                                           embedding if s == 0 else 0, dp * cp)
                              for p, s in zip(params, stages)),
                          post_validation=args.schedule.enable_optimizer_post_validation,
                          replicated=layout.mode.is_ddp,
                          norm_mask=tuple(is_last and tied for is_last in last))
        sizes = [chunk_sizes(model, tokens=tokens, layers=counts[s], last=is_last, tp=tp,
                             vocab_size=vocab, fused_loss=fused_loss,
                             sequence_parallel=args.parallel.sequence_parallel)
                 for s, is_last in zip(stages, last)]
        if residency == "layer" and dp * cp > 1:  # a layer and the next, gathered ahead
            layer = layer_params(model, tp=tp) * units.param_bytes
            sizes = [dataclasses.replace(  # the embedding: with layer 0 gathered ahead
                s, transient_f=s.transient_f + max(2 * layer, e * units.param_bytes + layer
                                                   if e else 0),
                transient_b=s.transient_b + 2 * layer) for s, e in zip(sizes, per_use_embedding)]
        timeline = schedule_peak(schedule, pp_rank, sizes, message_bytes=message,
                                 costs=costs)
        peaks.append(float(sum(state_bytes(units).values()) +
                           sum(timeline.values())))
    return tuple(peaks)


def _local_grads(args, mode, dp: int) -> bool:
    """Whether the engine the training builds (data-parallel ``mode``) sums weight
    gradients in main_grads."""
    from odc_pp.odc.engine import accumulates_locally
    from .odc_settings import odc_config

    config = odc_config(args.parallel, mode, param_dtype=args.model.compute_dtype)
    return accumulates_locally(config, dp=dp,
                               deterministic=not args.parallel.nondeterministic_dp)


def _main_grad_bytes(args, mode) -> int:
    """Bytes of one main_grad value (--grad-reduce-in-bf16 with --bf16: 2)."""
    from .odc_settings import odc_config

    dtype = odc_config(args.parallel, mode, param_dtype=args.model.compute_dtype).main_grad_dtype
    return 2 if dtype == "bfloat16" else 4


def job_costs(job: Job):
    """The costs training generates the ``job``'s schedules for (--cost-model, full
    recompute)."""
    from .components import load_cost_model, recompute_costs

    return recompute_costs(load_cost_model(job.args.schedule), job.args, job.layout.pp,
                           job.placement)


def replica_microbatches(args: TrainingArgs, dp: int) -> int:
    """Microbatches of one replica: samples / micro batch size, or with
    --max-tokens-per-microbatch the packed count (full sequences assumed)."""
    samples = args.data.global_batch_size // dp
    packed = args.data.max_tokens_per_microbatch
    if packed:
        return max(1, math.ceil(samples * args.model.seq_length / packed))
    return samples // args.data.micro_batch_size


def _layer_shard(params: int, layers: int, layer: int, embedding: int, dp: int) -> int:
    """Elements of a rank's shard of a chunk under layer residency: the embedding (first
    stage), each layer and the rest sharded on their own, each padded to whole
    ``dp`` parts (``odc_pp.odc.shard_map``)."""
    rest = params - layers * layer - embedding
    return layers * -(-layer // dp) + -(-embedding // dp) + -(-max(rest, 0) // dp)
