"""The planner's per-microbatch costs (steps 1 and 2 of :mod:`odc_pp.planner.search`):
the sampled minibatches planned as ``pretrain_gpt.py`` plans them, each microbatch's
F/B/W seconds per virtual stage, and a replica's pipeline cost model from them. Every
result is remembered in ``PlanConfig.memo`` (the same shapes recur across candidates).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from odc_pp.data import AttentionCost, plan_minibatch
from odc_pp.schedule.costs import CostModel, tensor_parallel_comm_seconds

from . import context_parallel as cpm
from .config import GB, Candidate, PlanConfig
from .hardware import EMBEDDING_GRAD_BYTES, OUTPUT_GRAD_BYTES
from .inputs import ModelSpec
from .rough_memory import chunk_activation_bytes
from .uneven import stage_layout

__all__ = ["Drawn", "drawn_plans", "replica_costs", "sample_cost", "scaled_costs",
           "stage_times", "total_of"]


def sample_cost(model: ModelSpec) -> AttentionCost:
    """Sample assignment's default cost model (training.data_plan.sample_cost_model)."""
    def flops(seq: int) -> float:
        return sum(model.layer_flops(1, seq))

    quadratic = (flops(2) - 2 * flops(1)) / 2
    return AttentionCost(quadratic_coef=quadratic / (flops(1) - quadratic))


def _shapes(groups: list[list[int]], lengths: np.ndarray, packed: bool) -> list[tuple]:
    """(rows, row length, documents) of each microbatch: documents are the packed samples'
    lengths (attention per document on GPU: varlen / flex), None for padded rows."""
    return [(1, int(lengths[g].sum()), tuple(int(v) for v in lengths[g])) if packed
            else (len(g), int(lengths[g].max()), None) for g in groups]


def stage_times(config: PlanConfig, cand: Candidate, rows: int, length: int,
                 documents: tuple | None = None) -> tuple[list[float], list[float], list[float]]:
    """F, B, W seconds of one microbatch ``[rows, length]`` per virtual stage (packed:
    attention per document); computed once per shape and layout."""
    cache = config.memo.setdefault("stage_times", {})
    key = (cand.tp, cand.cp, cand.pp, cand.num_chunks, cand.recompute,
           cand.keep_sp_input_for_w, cand.uneven, cand.accounted, rows, length, documents)
    if key not in cache:
        cache[key] = _compute_stage_times(config, cand, rows, length, documents)
    return cache[key]


def _compute_stage_times(config: PlanConfig, cand: Candidate, rows: int, length: int,
                         documents: tuple | None) -> tuple[list[float], list[float],
                                                           list[float]]:
    # times from the FLOPs the kernels execute (causal attention: half the formula's);
    # the MFU numerator (_draw_plans) keeps Megatron-LM's formula
    model, cluster = config.model, config.cluster
    counts = stage_layout(config, cand).counts()
    share = cpm.compute_share(cand.cp)
    tokens = rows * length * share  # one CP rank's tokens
    speed = cluster.flops_per_s(tokens) * cand.tp
    if documents:
        f, b, w = np.sum([model.executed_layer_flops(1, d) for d in documents],
                         axis=0) * share
    else:
        f, b, w = np.multiply(model.executed_layer_flops(rows, length), share)
    ring_f, ring_b = cpm.ring_seconds(
        model, rows=rows, length=length, cp=cand.cp, tp=cand.tp,
        link_bytes_per_s=cpm.ring_link(cluster, tp=cand.tp, cp=cand.cp),
        flops_per_s=speed / cand.tp)
    cf, cb, cw = tensor_parallel_comm_seconds(
        tokens=tokens, hidden=model.hidden_size, bytes_per_value=2, tp=cand.tp,
        link_bytes_per_s=(cluster.tp_link_gbps or math.inf) * GB,
        sequence_parallel=cand.tp > 1,
        keep_sp_input_for_w=cand.keep_sp_input_for_w,
        latency_s=cluster.tp_link_latency_us * 1e-6)
    t_f = f / speed + cf + ring_f  # one layer
    t_b = b / speed + cb + ring_b + (0.05 * f / speed if cand.recompute else 0.0)
    t_w = w / speed + cw
    logits = 2.0 * tokens * model.hidden_size * model.vocab_size / speed
    table = model.vocab_size * model.hidden_size / cand.tp  # a rank's embedding elements
    out = [[n * t for n in counts] for t in (t_f, t_b, t_w)]
    out[0][-1] += logits
    out[1][-1] += logits
    # W of the output layer: its GEMM, then the bf16 product added into the fp32
    # main_grad; of the embedding: its dense gradient, then the same add (memory-bound)
    out[2][-1] += logits + cluster.stream_seconds(table * OUTPUT_GRAD_BYTES)
    out[2][0] += cluster.stream_seconds(table * EMBEDDING_GRAD_BYTES)
    return out[0], out[1], out[2]


def replica_costs(config: PlanConfig, cand: Candidate, shapes: list[tuple[int, int]],
                   link: float, memory: tuple[float, float, float]) -> CostModel:
    """A replica's costs: per-stage means, each microbatch scaled by its own cost (once
    per layout and replica: schedules of the same chunk count share them)."""
    cache = config.memo.setdefault("replica_costs", {})
    key = (cand.tp, cand.cp, cand.pp, cand.num_chunks, cand.recompute,
           cand.keep_sp_input_for_w, cand.uneven, cand.accounted, bool(cand.offloaded), link,
           memory, tuple(shapes))
    if key not in cache:
        times = [stage_times(config, cand, rows, length, docs)
                 for rows, length, docs in shapes]
        cache[key] = scaled_costs(config, cand, shapes, times, link, memory)
    return cache[key]


def total_of(config: PlanConfig) -> Callable[[tuple], float]:
    """A microbatch's F + B + W seconds over its stages, from :func:`stage_times`'s
    result (remembered per result: the same ones recur across candidates)."""
    totals = config.memo.setdefault("stage_totals", {})

    def total(times: tuple) -> float:
        value = totals.get(id(times))
        if value is None or value[0] is not times:
            value = totals[id(times)] = (times, float(np.sum(times)))
        return value[1]
    return total


def scaled_costs(config: PlanConfig, cand: Candidate, shapes: list[tuple[int, int]],
                  times: list, link: float, memory: tuple[float, float, float]) -> CostModel:
    """Mean F/B/W per stage over ``times`` (one (F, B, W) per microbatch), with
    ``microbatch_scale`` = each microbatch's total over the mean total (uneven lengths
    leave bubbles that a mean cost hides)."""
    mean = [np.mean([t[k] for t in times], axis=0).tolist() for k in range(3)]
    totals = list(map(total_of(config), times))
    average = float(np.mean(totals))
    scale = [total / average for total in totals] if average > 0 else None
    tokens = float(np.mean([r * s for r, s, _ in shapes]))
    comm = tokens * config.model.hidden_size * 2 / (cand.tp * cand.cp) / link \
        if cand.pp > 1 else 0.0
    # an offloaded microbatch-chunk's activations cross the host link each way
    host = config.cluster.host_link_gbps * GB / chunk_activation_bytes(config, cand, tokens) \
        if cand.offloaded else None
    return CostModel(t_f=mean[0], t_b=mean[1], t_w=mean[2], t_comm=comm,
                     mem_f=memory[0], mem_b=memory[1], mem_w=memory[2],
                     microbatch_scale=scale, offload_bandwidth=host)


def drawn_plans(config: PlanConfig, cand: Candidate, cost_model) -> list:
    """The sampled minibatches' plans; they depend on dp, pp and the data flags only, so
    they are computed once per ``config`` for those."""
    key = (cand.dp, cand.pp, cand.balance, cand.packed, cand.token_cap, cand.micro_batch)
    cache = config.memo.setdefault("plans", {})
    if key not in cache:
        cache[key] = _draw_plans(config, cand, cost_model)
    return cache[key]


@dataclass(frozen=True)
class Drawn:
    """One sampled minibatch and what every candidate reads of its plan."""

    shapes: list
    """Per replica, each microbatch's (rows, row length, documents); see ``_shapes``."""
    biggest: int
    """Tokens of the largest microbatch."""
    tokens: int
    """Real tokens of the minibatch."""
    flops: float
    """Model FLOPs of the minibatch (per sample: its layers, logits and their backward)."""


def _draw_plans(config: PlanConfig, cand: Candidate, cost_model) -> list[Drawn]:
    rng = np.random.default_rng(config.seed)
    model = config.model
    sample_flops = config.memo.setdefault("sample_flops", {})
    out = []
    for _ in range(config.samples):
        lengths = config.lengths[rng.integers(0, len(config.lengths), config.global_batch)]
        cap = (cand.token_cap if cand.token_cap is not None
               else config.model.seq_length * cand.micro_batch)
        plan = plan_minibatch(lengths, cand.dp, max_tokens=cap, mode=cand.balance,
                              cost_model=cost_model, min_microbatches=cand.pp,
                              samples_per_microbatch=None if cand.packed else cand.micro_batch,
                              packed=cand.packed, segment_attention=True)
        shapes = [_shapes(groups, lengths, cand.packed) for groups in plan.microbatches]
        for s in map(int, lengths):
            if s not in sample_flops:
                sample_flops[s] = sum(model.layer_flops(1, s)) * model.num_layers \
                    + 6.0 * s * model.hidden_size * model.vocab_size
        out.append(Drawn(shapes=shapes,
                          biggest=max(r * s for replica in shapes for r, s, _ in replica),
                          tokens=int(lengths.sum()),
                          flops=sum(sample_flops[s] for s in map(int, lengths))))
    return out
