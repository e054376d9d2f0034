"""The planner's performance model and search (see docs/planner.md).

A candidate (tp, pp, dp, schedule family and chunks, recompute, offload, dp mode, load
balance, packing and token cap) is predicted as follows, deterministically:

1. ``samples`` global minibatches are drawn (fixed seed) from the length distribution
   and planned by :func:`odc_pp.data.plan_minibatch` exactly as ``pretrain_gpt.py`` plans
   them (the same mode, cap, packing and FLOPs cost model): microbatch counts and shapes
   per replica.
2. A microbatch's F/B/W time on one virtual stage is its FLOPs
   (:func:`~odc_pp.schedule.costs.transformer_layer_flops` on the executed shape: padded
   rows, or a packed row's documents, whose attention the GPU kernels (varlen / flex)
   compute per document; the output layer on the last stage) over the
   cluster's achieved FLOP/s for that microbatch size (:meth:`Hardware.flops_per_s`, an
   efficiency curve), divided by tp, plus the tensor-parallel collectives
   (:func:`~odc_pp.schedule.costs.tensor_parallel_comm_seconds`). With context
   parallelism (cp > 1) a rank computes 1/cp of it plus the exposed ring transfers
   (:mod:`odc_pp.planner.context_parallel`: every CP formula), holds 1/cp of the
   activations and shards the optimizer state over dp x cp. The W of the first and last
   stage also streams the embedding's dense gradient and the output layer's product into
   the fp32 ``main_grad`` (:meth:`Hardware.stream_seconds`, memory-bound).
3. Each replica's pipeline is the schedule ``pretrain_gpt.py`` builds
   (:func:`~odc_pp.schedule.build.build`), simulated
   (:func:`~odc_pp.schedule.simulator.simulate`) with the replica's mean microbatch costs
   and the pipeline transfer time of its activations (NVLink inside a node, else the
   inter-node link). ODC: the step waits once for the slowest replica. Collective: the
   replicas run in lock step, each microbatch as slow as its slowest replica's.
4. Data-parallel gradient traffic that is not overlapped is added: collective all-reduce
   (2 (dp-1)/dp of the stage's bf16 gradients), ODC reduce-scatter ((dp-1)/dp). So is the
   optimizer step of a rank's owned shard (:meth:`Hardware.optimizer_seconds`: a fused
   AdamW streaming its fp32 state at the device's memory bandwidth; the ranks step after
   the minibatch, without post-validation).
5. Peak memory per pipeline rank: ``PlanConfig.rank_memory`` of the printed flags when
   given -- ``odc-pp plan`` gives the dry run's memory model
   (:func:`odc_pp.training.plan_memory.rank_peaks`: the same state formulas and schedule
   walk, so the plan's fits/does-not-fit is the dry run's); without it (library callers
   below the training layer, ``odc-pp tune-offload``) a rough estimate: bf16
   parameters, fp32 gradients, fp32 master + Adam sharded over dp (the embedding on the
   first stage, the output layer on the last), the logits of the last stage, and the
   simulator's activation peak (microbatch chunks; an offloaded chunk leaves the device
   when its OFFLOAD completes) times the largest microbatch chunk's bytes.

Offloading candidates (``--cpu-offload --offload-chunks``) move each offloaded
microbatch-chunk's activations over the host link (``Hardware.host_link_gbps``) and back,
overlapping compute as the simulator's host-link stream does. ``odc-pp tune-offload`` is
a view of this search (:func:`rank` of its own candidates at a fixed tp and pp).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import multiprocessing
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from odc_pp.data import AttentionCost, plan_minibatch
from odc_pp.schedule.costs import CostModel, tensor_parallel_comm_seconds
from odc_pp.schedule.build import ScheduleRequest, build
from odc_pp.schedule.generators import family
from odc_pp.schedule.simulator import compile_schedule, simulate

from . import context_parallel as cpm
from .candidates import MEGATRON_SOURCE, candidates, megatron_default
from .config import GB, SCHEDULES, Candidate, PlanConfig, Prediction
from .hardware import EMBEDDING_GRAD_BYTES, OUTPUT_GRAD_BYTES
from .inputs import ModelSpec
from .rough_memory import chunk_bytes, memory_units, peak_bytes

__all__ = ["PlanConfig", "Prediction", "Candidate", "plan", "predict", "pipeline_time",
           "megatron_default", "flags_of", "MEGATRON_SOURCE", "candidates", "SCHEDULES",
           "rank", "request_of", "pipeline_costs"]

def pipeline_time(request: ScheduleRequest, costs: CostModel,
                  plan_costs: CostModel | None = None):
    """The simulated pipeline of the schedule ``pretrain_gpt.py`` builds for ``request``
    (compute-only: ``communication=False``) from its planning cost model ``plan_costs``
    (its ``--cost-model``; None: the default): (SimResult, Schedule). The one pipeline
    model of the planner, its validation and ``odc-pp tune-offload``."""
    compiled = _planned(request, _costs_key(plan_costs))
    return simulate(compiled, costs), compiled.schedule


def _costs_key(plan_costs: CostModel | None) -> str:
    """:func:`_planned`'s key of a planning cost model (its JSON; empty: the default)."""
    return "" if plan_costs is None else json.dumps(plan_costs.to_dict(), sort_keys=True)


def _simulate_planned(config: PlanConfig, request: ScheduleRequest, costs: CostModel):
    """:func:`pipeline_time`'s simulation with ``config``'s planning cost model, its key
    computed once per config (this runs for every replica of every candidate)."""
    key = config.memo.get("plan_costs_key")
    if key is None:
        key = config.memo["plan_costs_key"] = _costs_key(config.plan_costs)
    return simulate(_planned(request, key), costs)


def request_of(cand: Candidate, num_microbatches: int) -> ScheduleRequest:
    """The compute-only request of candidate ``cand`` at ``num_microbatches`` (what
    ``pretrain_gpt.py`` builds from :func:`flags_of`, less its communication)."""
    return ScheduleRequest.of(cand.schedule, pp=cand.pp, num_microbatches=num_microbatches,
                              offload_chunks=list(cand.offloaded) or None,
                              communication=False)


@functools.lru_cache(maxsize=4096)
def _planned(request: ScheduleRequest, plan_costs: str):
    """Schedules are planned with the frontend's cost model (``plan_costs``: its JSON,
    empty for the default), so one per request, compiled once for the simulator (which
    does not modify them)."""
    costs = CostModel.from_dict(json.loads(plan_costs)) if plan_costs else CostModel()
    return compile_schedule(build(request, costs))


def _sample_cost(model: ModelSpec) -> AttentionCost:
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


def _stage_times(config: PlanConfig, cand: Candidate, rows: int, length: int,
                 documents: tuple | None = None) -> tuple[list[float], list[float], list[float]]:
    """F, B, W seconds of one microbatch ``[rows, length]`` per virtual stage (packed:
    attention per document); computed once per shape and layout."""
    cache = config.memo.setdefault("stage_times", {})
    key = (cand.tp, cand.cp, cand.pp, family(cand.schedule).default_chunks, cand.recompute,
           cand.keep_sp_input_for_w, rows, length, documents)
    if key not in cache:
        cache[key] = _compute_stage_times(config, cand, rows, length, documents)
    return cache[key]


def _compute_stage_times(config: PlanConfig, cand: Candidate, rows: int, length: int,
                         documents: tuple | None) -> tuple[list[float], list[float],
                                                           list[float]]:
    model, cluster = config.model, config.cluster
    chunks = family(cand.schedule).default_chunks
    stages = cand.pp * chunks
    layers = model.num_layers / stages
    share = cpm.compute_share(cand.cp)
    tokens = rows * length * share  # one CP rank's tokens
    speed = cluster.flops_per_s(tokens) * cand.tp
    if documents:
        f, b, w = np.sum([model.layer_flops(1, d) for d in documents], axis=0) * share
    else:
        f, b, w = np.multiply(model.layer_flops(rows, length), share)
    ring_f, ring_b = cpm.ring_seconds(
        model, rows=rows, length=length, cp=cand.cp, tp=cand.tp,
        link_bytes_per_s=cpm.ring_link(cluster, tp=cand.tp, cp=cand.cp),
        flops_per_s=speed / cand.tp)
    cf, cb, cw = tensor_parallel_comm_seconds(
        tokens=tokens, hidden=model.hidden_size, bytes_per_value=2, tp=cand.tp,
        link_bytes_per_s=(cluster.tp_link_gbps or math.inf) * GB,
        sequence_parallel=cand.tp > 1,
        keep_sp_input_for_w=cand.keep_sp_input_for_w)
    t_f = layers * (f / speed + cf + ring_f)
    t_b = layers * (b / speed + cb + ring_b) + (0.05 * layers * f / speed if cand.recompute
                                                 else 0.0)
    t_w = layers * (w / speed + cw)
    logits = 2.0 * tokens * model.hidden_size * model.vocab_size / speed
    table = model.vocab_size * model.hidden_size / cand.tp  # a rank's embedding elements
    out = [[t_f] * stages, [t_b] * stages, [t_w] * stages]
    out[0][-1] += logits
    out[1][-1] += logits
    # W of the output layer: its GEMM, then the bf16 product added into the fp32
    # main_grad; of the embedding: its dense gradient, then the same add (memory-bound)
    out[2][-1] += logits + cluster.stream_seconds(table * OUTPUT_GRAD_BYTES)
    out[2][0] += cluster.stream_seconds(table * EMBEDDING_GRAD_BYTES)
    return out[0], out[1], out[2]


def _replica_costs(config: PlanConfig, cand: Candidate, shapes: list[tuple[int, int]],
                   link: float, memory: tuple[float, float, float]) -> CostModel:
    """A replica's costs: per-stage means, each microbatch scaled by its own cost (once
    per layout and replica: schedules of the same chunk count share them)."""
    cache = config.memo.setdefault("replica_costs", {})
    key = (cand.tp, cand.cp, cand.pp, family(cand.schedule).default_chunks, cand.recompute,
           cand.keep_sp_input_for_w, bool(cand.offloaded), link, memory, tuple(shapes))
    if key not in cache:
        times = [_stage_times(config, cand, rows, length, docs)
                 for rows, length, docs in shapes]
        cache[key] = _scaled_costs(config, cand, shapes, times, link, memory)
    return cache[key]


def _total_of(config: PlanConfig) -> Callable[[tuple], float]:
    """A microbatch's F + B + W seconds over its stages, from :func:`_stage_times`'s
    result (remembered per result: the same ones recur across candidates)."""
    totals = config.memo.setdefault("stage_totals", {})

    def total(times: tuple) -> float:
        value = totals.get(id(times))
        if value is None or value[0] is not times:
            value = totals[id(times)] = (times, float(np.sum(times)))
        return value[1]
    return total


def _scaled_costs(config: PlanConfig, cand: Candidate, shapes: list[tuple[int, int]],
                  times: list, link: float, memory: tuple[float, float, float]) -> CostModel:
    """Mean F/B/W per stage over ``times`` (one (F, B, W) per microbatch), with
    ``microbatch_scale`` = each microbatch's total over the mean total (uneven lengths
    leave bubbles that a mean cost hides)."""
    mean = [np.mean([t[k] for t in times], axis=0).tolist() for k in range(3)]
    totals = list(map(_total_of(config), times))
    average = float(np.mean(totals))
    scale = [total / average for total in totals] if average > 0 else None
    tokens = float(np.mean([r * s for r, s, _ in shapes]))
    comm = tokens * config.model.hidden_size * 2 / (cand.tp * cand.cp) / link \
        if cand.pp > 1 else 0.0
    # an offloaded microbatch-chunk's activations cross the host link each way
    host = config.cluster.host_link_gbps * GB / chunk_bytes(config, cand, tokens) \
        if cand.offloaded else None
    return CostModel(t_f=mean[0], t_b=mean[1], t_w=mean[2], t_comm=comm,
                     mem_f=memory[0], mem_b=memory[1], mem_w=memory[2],
                     microbatch_scale=scale, offload_bandwidth=host)


def _plans(config: PlanConfig, cand: Candidate, cost_model) -> list:
    """The sampled minibatches' plans; they depend on dp, pp and the data flags only, so
    they are computed once per ``config`` for those."""
    key = (cand.dp, cand.pp, cand.balance, cand.packed, cand.token_cap, cand.micro_batch)
    cache = config.memo.setdefault("plans", {})
    if key not in cache:
        cache[key] = _draw_plans(config, cand, cost_model)
    return cache[key]


@dataclass(frozen=True)
class _Drawn:
    """One sampled minibatch and what every candidate reads of its plan."""

    shapes: list
    """Per replica, each microbatch's (rows, row length, documents); see ``_shapes``."""
    biggest: int
    """Tokens of the largest microbatch."""
    tokens: int
    """Real tokens of the minibatch."""
    flops: float
    """Model FLOPs of the minibatch (per sample: its layers, logits and their backward)."""


def _draw_plans(config: PlanConfig, cand: Candidate, cost_model) -> list[_Drawn]:
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
        out.append(_Drawn(shapes=shapes,
                          biggest=max(r * s for replica in shapes for r, s, _ in replica),
                          tokens=int(lengths.sum()),
                          flops=sum(sample_flops[s] for s in map(int, lengths))))
    return out


def _link_bytes(config: PlanConfig, inside: bool) -> float:
    """Bytes/s between two GPUs of the job: NVLink inside a node, else the inter-node
    link; unknown (a measured machine has neither figure): not costed."""
    cluster = config.cluster
    gbps = cluster.tp_link_gbps if inside else cluster.internode_gbps
    return (gbps or math.inf) * GB


def _pipeline_link(config: PlanConfig, cand: Candidate) -> float:
    """The link between a candidate's pipeline stages (:func:`_link_bytes`)."""
    return _link_bytes(config, cand.tp * cand.cp * cand.pp <= config.cluster.gpus_per_node)


def _dp_comm(config: PlanConfig, cand: Candidate) -> float:
    group = cpm.sharding_group(cand.dp, cand.cp)  # gradients are summed over dp x cp
    if group == 1:
        return 0.0
    grads = config.model.params() / (cand.tp * cand.pp) * 2  # bf16 gradient bytes per rank
    inside = cand.tp * cand.pp * group <= config.cluster.gpus_per_node
    link = _link_bytes(config, inside)
    share = (group - 1) / group * grads / link
    return 2 * share if cand.dp_mode.is_collective else share


def _optimizer_seconds(config: PlanConfig, cand: Candidate) -> float:
    """A rank's optimizer step: its owned shard of the parameters (the model spread evenly
    over tp x pp, the optimizer state sharded over dp x cp)."""
    owned = config.model.params() / (cand.tp * cand.pp * cpm.sharding_group(cand.dp, cand.cp))
    return config.cluster.optimizer_seconds(owned)


def _minibatch_step(config: PlanConfig, cand: Candidate, per_replica: list,
                    link: float) -> tuple[tuple[float, ...], list]:
    """((step, compute, bubble, dp wait) seconds, simulations) of one planned minibatch
    (``per_replica``: each replica's microbatch shapes)."""
    memory = memory_units(config, cand)
    if cand.dp_mode.is_collective:
        counts = {len(s) for s in per_replica}
        if len(counts) != 1:
            raise ValueError("collective needs equal microbatch counts")
        count = counts.pop()
        # each microbatch's stage times, computed once for the replicas and the lock step
        times = [[_stage_times(config, cand, *shape) for shape in s] for s in per_replica]
        own = [_scaled_costs(config, cand, s, t, link, memory)
               for s, t in zip(per_replica, times)]
        # lock step: at every microbatch position the slowest replica's microbatch
        total = _total_of(config)
        slowest = [max((t[j] for t in times), key=total) for j in range(count)]
        widest = [max((s[j] for s in per_replica), key=lambda sh: sh[0] * sh[1])
                  for j in range(count)]
        lock = _scaled_costs(config, cand, widest, slowest, link, memory)
        sim = _simulate_planned(config, request_of(cand, count), lock)
        busy = max(sim.busy)
        # each replica's own work on its busiest rank; the rest of lock step is waiting
        chunks = family(cand.schedule).default_chunks
        work = float(np.mean([count * chunks * max(np.add(np.add(c.t_f, c.t_b), c.t_w))
                              for c in own]))
        return (sim.makespan, min(work, busy), sim.makespan - busy,
                max(0.0, busy - work)), [sim]
    sims = [_simulate_planned(config, request_of(cand, len(shapes)),
                              _replica_costs(config, cand, shapes, link, memory))
            for shapes in per_replica]
    spans = [sim.makespan for sim in sims]
    return (max(spans), float(np.mean([max(sim.busy) for sim in sims])),
            float(np.mean([sim.makespan - max(sim.busy) for sim in sims])),
            max(spans) - float(np.mean(spans))), sims


def _simulated(config: PlanConfig, cand: Candidate, link: float) -> tuple:
    """(per minibatch (step, compute, bubble, dp wait), activation units per rank, the
    biggest microbatch's tokens, real tokens and model FLOPs per minibatch) of the
    sampled minibatches; simulated once per candidate."""
    cache = config.memo.setdefault("simulated", {})
    key = _key(cand) + (cand.dp,)
    if key in cache:
        return cache[key]
    model = config.model
    parts, units, biggest, real_tokens, flops = [], np.zeros(cand.pp), 0, [], []
    for drawn in _plans(config, cand, _sample_cost(model)):
        times, sims = _minibatch_step(config, cand, drawn.shapes, link)
        parts.append(times)
        for sim in sims:
            units = np.maximum(units, sim.peak_activation)
        biggest = max(biggest, drawn.biggest)
        real_tokens.append(drawn.tokens)
        flops.append(drawn.flops)
    cache[key] = parts, units, biggest, real_tokens, flops
    return cache[key]


def _check_memo(config: PlanConfig) -> None:
    """Empty ``config.memo`` if it was filled for other timing inputs (a copy made with
    ``replace`` that changed the model, cluster, job or lengths)."""
    if config.memo.get("checked") is config:  # checked once per config object
        return
    inputs = repr((config.model, config.cluster, config.gpus, config.global_batch,
                   config.samples, config.seed, config.flash_attention,
                   config.plan_costs)) + \
        hashlib.sha256(np.ascontiguousarray(config.lengths).tobytes()).hexdigest()
    if config.memo.get("inputs") != inputs:
        config.memo.clear()
        config.memo["inputs"] = inputs
    config.memo["checked"] = config


def predict(config: PlanConfig, cand: Candidate) -> Prediction:
    """The prediction of one candidate (ValueError: the candidate cannot run)."""
    _check_memo(config)
    model, cluster = config.model, config.cluster
    link = _pipeline_link(config, cand)
    parts, units, biggest, real_tokens, flops = _simulated(config, cand, link)
    step, compute, bubble, wait = (float(v) for v in np.mean(parts, axis=0))
    comm = _dp_comm(config, cand)
    optimizer = _optimizer_seconds(config, cand)
    step_s = step + comm + optimizer
    flags = flags_of(config, cand)
    peaks = config.rank_memory(flags, config.gpus) if config.rank_memory is not None \
        else peak_bytes(config, cand, units, biggest)
    mfu = float(np.mean(flops)) / (step_s * config.gpus * cluster.peak_tflops * 1e12)
    return Prediction(candidate=cand, step_s=step_s,
                      tokens_per_s=float(np.mean(real_tokens)) / step_s,
                      breakdown={"compute": compute, "bubble": bubble, "dp_wait": wait,
                                 "comm": comm, "optimizer": optimizer},
                      peak_memory_gb=[round(p / GB, 3) for p in peaks],
                      fits=bool(max(peaks) <= config.memory_bytes), mfu=mfu,
                      flags=flags)


def flags_of(config: PlanConfig, cand: Candidate) -> list[str]:
    """The ``pretrain_gpt.py`` flags of a candidate (add the data flags; run on
    tp x cp x pp x dp ranks)."""
    fam = family(cand.schedule)
    model_flags = config.model.model_flags()
    flags = model_flags + ([] if {"--bf16", "--fp16"} & set(model_flags) else ["--bf16"]) + [
        "--tensor-model-parallel-size", str(cand.tp),
        "--pipeline-model-parallel-size", str(cand.pp),
        "--pipeline-schedule", cand.schedule, "--num-model-chunks", str(fam.default_chunks),
        "--dp-mode", cand.dp_mode.value, "--load-balance", cand.balance,
        "--global-batch-size", str(config.global_batch),
        "--micro-batch-size", str(cand.micro_batch)]
    if cand.cp > 1:
        flags += ["--context-parallel-size", str(cand.cp)]
    if cand.packed:
        flags += ["--pack-sequences", "--max-tokens-per-microbatch", str(cand.token_cap)]
    elif cand.balance == "lb-mini":
        flags.append("--no-pack-sequences")
    if cand.tp > 1:
        flags.append("--sequence-parallel")
    if cand.recompute:
        flags.append("--recompute-lgd")
    if cand.keep_sp_input_for_w:
        flags.append("--keep-sp-input-for-w")
    if cand.offloaded:
        flags += ["--cpu-offload", "--offload-chunks", *map(str, cand.offloaded)]
    if config.plan_costs_path is not None:
        flags += ["--cost-model", config.plan_costs_path]
    return flags


REFINED = 12
"""Candidates whose memory :func:`plan` takes from ``PlanConfig.rank_memory`` (the dry
run's model, seconds each), fastest first, until this many fit; the rest keep the
closed-form estimate (:func:`_peak_bytes`)."""


def _predict_fitting(config: PlanConfig, cand: Candidate) -> Prediction:
    """:func:`predict`; a candidate that does not fit memory is tried again with
    --recompute-lgd and the better of the two kept."""
    pred = predict(config, cand)
    if not pred.fits:
        again = Candidate(**{**vars(cand), "recompute": True})
        if _may_fit(config, again):
            pred = min(pred, predict(config, again),
                       key=lambda p: (not p.fits, -p.tokens_per_s))
    return pred


def _may_fit(config: PlanConfig, cand: Candidate) -> bool:
    """Whether ``cand`` (a recompute retry of a simulated candidate) can fit, known
    without simulating it: recompute only lengthens B, which never speeds a fixed-order
    schedule up, so a retry that does not fit either would lose to the original. Its
    activation peak is the original's: a rank's peak is the in-order running sum, whatever
    the durations (offloading families excepted: their host link is timed)."""
    if family(cand.schedule).offloads:
        return True
    original = config.memo.get("simulated", {}).get(
        _key(Candidate(**{**vars(cand), "recompute": False})) + (cand.dp,))
    if original is None:
        return True
    _, units, biggest, _, _ = original
    peaks = config.rank_memory(flags_of(config, cand), config.gpus) \
        if config.rank_memory is not None else peak_bytes(config, cand, units, biggest)
    return max(peaks) <= config.memory_bytes


def _order(preds: list[Prediction]) -> list[Prediction]:
    return sorted(preds, key=lambda p: (not p.fits, -p.tokens_per_s if p.fits
                                        else max(p.peak_memory_gb), _key(p.candidate)))


def plan(config: PlanConfig) -> tuple[list[Prediction], Prediction | None]:
    """(every candidate that runs, best first: fitting ones by tokens/s, then the rest by
    memory; the best Megatron-default configuration, or None if none runs). Every
    candidate is ranked with the closed-form memory estimate; then, with
    ``config.rank_memory``, the fastest ones (until :data:`REFINED` fit) and the best
    Megatron default take their memory from it, so every printed plan's figure is the dry
    run's."""
    rough = replace(config, rank_memory=None)
    out = [pred for pred in _predict_all(rough, candidates(config)) if pred is not None]
    for pred in out:
        pred.megatron_default = megatron_default(pred.candidate)
    out = _order(out)
    if config.rank_memory is not None:
        out = _order(_refine(config, out))
    default = next((p for p in out if p.megatron_default), None)
    return out, default


def rank(config: PlanConfig, cands: list[Candidate], *,
         refine: int | None = REFINED) -> list[Prediction]:
    """Given candidates (a view's axes, e.g. ``odc-pp tune-offload``'s), each predicted as
    it is (no recompute retry; those that cannot run are left out), ordered as
    :func:`plan` orders them; with ``config.rank_memory`` the fastest, until ``refine``
    fit (None: every one), take their memory from it."""
    rough = replace(config, rank_memory=None)
    out = _order([pred for pred in map(functools.partial(_predict_or_none, rough), cands)
                  if pred is not None])
    if config.rank_memory is None:
        return out
    refined, fitting = [], 0
    for pred in out:
        if refine is None or fitting < refine:
            pred = predict(config, pred.candidate)
            fitting += pred.fits
        refined.append(pred)
    return _order(refined)


def _predict_or_none(config: PlanConfig, cand: Candidate) -> Prediction | None:
    try:
        return predict(config, cand)
    except ValueError:  # shape the schedule or sample assignment rejects
        return None


def pipeline_costs(config: PlanConfig, cand: Candidate) -> CostModel:
    """The costs the first replica of the first sampled minibatch is simulated with (its
    own microbatches; collective lock step aside): what a test re-simulates."""
    _check_memo(config)
    shapes = _plans(config, cand, _sample_cost(config.model))[0].shapes[0]
    return _replica_costs(config, cand, shapes, _pipeline_link(config, cand),
                          memory_units(config, cand))


def _predict_all(config: PlanConfig, cands: list[Candidate]) -> list[Prediction | None]:
    """:func:`_predict_fitting` of each candidate (None: it cannot run), in order. With
    ``config.workers`` > 1 the layouts are spread over that many processes, largest
    pipelines first; every prediction is a function of the config and the candidate
    alone, so the result is the same."""
    layouts: dict[tuple, list[int]] = {}
    for index, cand in enumerate(cands):
        layouts.setdefault((cand.tp, cand.cp, cand.pp), []).append(index)
    if config.workers <= 1 or len(layouts) < 2:
        return _predict_group(config, cands)
    groups = sorted(layouts.values(), key=lambda g: (-cands[g[0]].pp, g[0]))
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    out: list[Prediction | None] = [None] * len(cands)
    with context.Pool(min(config.workers, len(groups))) as pool:
        work = [[cands[i] for i in group] for group in groups]
        for group, preds in zip(groups, pool.imap(functools.partial(_predict_group, config),
                                                  work)):
            for index, pred in zip(group, preds):
                out[index] = pred
    return out


def _predict_group(config: PlanConfig, cands: list[Candidate]) -> list[Prediction | None]:
    out: list[Prediction | None] = []
    for cand in cands:
        try:
            out.append(_predict_fitting(config, cand))
        except ValueError:  # shape the schedule or sample assignment rejects
            out.append(None)
    return out


def _refine(config: PlanConfig, ranked: list[Prediction]) -> list[Prediction]:
    """``ranked`` with the fastest candidates' (and the best Megatron default's) memory
    from ``config.rank_memory``."""
    out, fitting, default_done = [], 0, False
    for pred in ranked:
        wanted = fitting < REFINED or (pred.megatron_default and not default_done)
        if wanted:
            base = Candidate(**{**vars(pred.candidate), "recompute": False})
            pred, default = _predict_fitting(config, base), pred.megatron_default
            pred.megatron_default = default
            fitting += pred.fits
            default_done |= default
        out.append(pred)
    return out


def _key(cand: Candidate) -> tuple:
    return (cand.tp, cand.cp, cand.pp, cand.schedule, cand.dp_mode, cand.balance,
            cand.token_cap or 0, cand.micro_batch, cand.recompute, cand.offloaded,
            cand.keep_sp_input_for_w)
