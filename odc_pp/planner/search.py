"""The planner's performance model and search (see docs/planner.md).

A candidate (tp, pp, dp, schedule family and chunks, recompute, offload, dp mode, load
balance, packing and token cap) is predicted as follows, deterministically:

1. ``samples`` global minibatches are drawn (fixed seed) from the length distribution
   and planned by :func:`odc_pp.data.plan_minibatch` exactly as ``pretrain_gpt.py`` plans
   them (the same mode, cap, packing and FLOPs cost model): microbatch counts and shapes
   per replica.
2. A microbatch's F/B/W time on one virtual stage is its FLOPs
   (:func:`~odc_pp.schedule.costs.transformer_layer_flops` with ``causal=True``, the
   FLOPs the kernels execute: causal attention at half the formula's, on the executed
   shape: padded rows, or a packed row's documents, whose attention the GPU kernels
   (varlen / flex) compute per document; the output layer on the last stage) over the
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
   inter-node link). ODC and ddp (Megatron's DDP): the step waits once for the slowest
   replica's whole minibatch. Collective (FSDP-style): the replicas run in lock step,
   each microbatch as slow as its slowest replica's (a replica with fewer microbatches
   replays only their collectives).
4. Data-parallel traffic that is not overlapped is added
   (:mod:`odc_pp.planner.dp_traffic`: collective all-reduce, ODC reduce-scatter, ddp's
   reduce-scatter beyond the last backward plus its parameter all-gather). So is the
   optimizer step of a rank's owned shard (:meth:`Hardware.optimizer_seconds`: a fused
   AdamW streaming its fp32 state at the device's memory bandwidth). The zero-bubble
   families whose iterations overlap run with optimizer post-validation (printed
   ``--enable-optimizer-post-validation``): their minibatch costs the schedule's steady
   period instead of its makespan (:mod:`odc_pp.planner.post_validation`).
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

Steps 1 and 2 (the sampled plans and each microbatch's stage times) are
:mod:`odc_pp.planner.microbatch_costs`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import multiprocessing
from dataclasses import replace

import numpy as np

from odc_pp.schedule.costs import CostModel
from odc_pp.schedule.build import ScheduleRequest, build
from odc_pp.schedule.generators import family
from odc_pp.schedule.simulator import compile_schedule, simulate

from . import context_parallel as cpm
from .candidates import MEGATRON_SOURCE, candidates, megatron_default
from .chunks import try_chunks
from .dp_traffic import dp_comm_seconds, link_bytes
from .config import GB, SCHEDULES, Candidate, PlanConfig, Prediction
from .microbatch_costs import (drawn_plans, replica_costs, sample_cost, scaled_costs,
                               stage_times, total_of)
from .post_validation import FLAG as POST_VALIDATION_FLAG
from .post_validation import iteration_seconds, post_validated
from .rough_memory import memory_units, peak_bytes
from .uneven import stage_layout, try_uneven

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


def _simulate_planned(config: PlanConfig, cand: Candidate, request: ScheduleRequest,
                      costs: CostModel):
    """:func:`pipeline_time`'s simulation with ``config``'s planning cost model, its key
    computed once per config (this runs for every replica of every candidate), and the
    minibatch's time: the makespan, or the steady period of a post-validated candidate
    (:mod:`~odc_pp.planner.post_validation`)."""
    key = config.memo.get("plan_costs_key")
    if key is None:
        key = config.memo["plan_costs_key"] = _costs_key(config.plan_costs)
    compiled = _planned(request, key)
    sim = simulate(compiled, costs)
    if not post_validated(config, cand):
        return sim, sim.makespan
    return sim, iteration_seconds(compiled.schedule, costs, sim.makespan)


def request_of(cand: Candidate, num_microbatches: int) -> ScheduleRequest:
    """The compute-only request of candidate ``cand`` at ``num_microbatches`` (what
    ``pretrain_gpt.py`` builds from :func:`flags_of`, less its communication)."""
    return ScheduleRequest.of(cand.schedule, pp=cand.pp, num_microbatches=num_microbatches,
                              num_chunks=cand.num_chunks,
                              offload_chunks=list(cand.offloaded) or None,
                              group_size=cand.group_size,
                              selective_offload=cand.selective_offload,
                              communication=False)


@functools.lru_cache(maxsize=4096)
def _planned(request: ScheduleRequest, plan_costs: str):
    """Schedules are planned with the frontend's cost model (``plan_costs``: its JSON,
    empty for the default), so one per request, compiled once for the simulator (which
    does not modify them)."""
    costs = CostModel.from_dict(json.loads(plan_costs)) if plan_costs else CostModel()
    return compile_schedule(build(request, costs))


def _pipeline_link(config: PlanConfig, cand: Candidate) -> float:
    """The link between a candidate's pipeline stages (:func:`~.dp_traffic.link_bytes`)."""
    return link_bytes(config, cand.tp * cand.cp * cand.pp <= config.cluster.gpus_per_node)


def _optimizer_seconds(config: PlanConfig, cand: Candidate) -> float:
    """A rank's optimizer step: its owned shard of the parameters (the model spread evenly
    over tp x pp, the optimizer state sharded over dp x cp)."""
    owned = config.model.params() / (cand.tp * cand.pp * cpm.sharding_group(cand.dp, cand.cp))
    return config.cluster.optimizer_seconds(owned)


def _minibatch_step(config: PlanConfig, cand: Candidate, per_replica: list,
                    link: float) -> tuple[tuple[float, ...], list]:
    """((step, compute, bubble, dp wait, last backward) seconds, simulations) of one
    planned minibatch (``per_replica``: each replica's microbatch shapes; last backward:
    the slowest replica's last microbatch's B + W on a rank, which ``ddp``'s gradient
    reduce-scatter overlaps)."""
    memory = memory_units(config, cand)
    if cand.dp_mode.is_collective:
        return _lock_step(config, cand, per_replica, link, memory)
    runs = [_simulate_planned(config, cand, request_of(cand, len(shapes)),
                              replica_costs(config, cand, shapes, link, memory))
            for shapes in per_replica]
    sims, spans = [sim for sim, _ in runs], [span for _, span in runs]
    slowest = per_replica[int(np.argmax(spans))]
    return (max(spans), float(np.mean([max(sim.busy) for sim in sims])),
            float(np.mean([span - max(sim.busy) for sim, span in runs])),
            max(spans) - float(np.mean(spans)),
            _last_backward(config, cand, slowest[-1])), sims


def _last_backward(config: PlanConfig, cand: Candidate, shape: tuple) -> float:
    """One microbatch's B + W on its busiest pipeline rank (every chunk of it)."""
    _, t_b, t_w = stage_times(config, cand, *shape)
    return cand.num_chunks * max(np.add(t_b, t_w))


def _lock_step(config: PlanConfig, cand: Candidate, per_replica: list, link: float,
               memory) -> tuple[tuple[float, ...], list]:
    """Collective (FSDP-style): the replicas run in lock step, at every microbatch
    position the slowest replica's microbatch; a replica with fewer microbatches replays
    only the collectives of the missing ones (no compute), as ``odc_pp.odc.engine`` does."""
    count = max(len(s) for s in per_replica)
    # each microbatch's stage times, computed once for the replicas and the lock step
    times = [[stage_times(config, cand, *shape) for shape in s] for s in per_replica]
    own = [scaled_costs(config, cand, s, t, link, memory)
           for s, t in zip(per_replica, times)]
    total = total_of(config)
    slowest = [max((t[j] for t in times if j < len(t)), key=total) for j in range(count)]
    widest = [max((s[j] for s in per_replica if j < len(s)), key=lambda sh: sh[0] * sh[1])
              for j in range(count)]
    lock = scaled_costs(config, cand, widest, slowest, link, memory)
    sim, span = _simulate_planned(config, cand, request_of(cand, count), lock)
    busy = max(sim.busy)
    # each replica's own work on its busiest rank; the rest of lock step is waiting
    chunks = cand.num_chunks
    work = float(np.mean([len(s) * chunks * max(np.add(np.add(c.t_f, c.t_b), c.t_w))
                          for s, c in zip(per_replica, own)]))
    return (span, min(work, busy), span - busy, max(0.0, busy - work), 0.0), [sim]


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
    for drawn in drawn_plans(config, cand, sample_cost(model)):
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
    step, compute, bubble, wait, overlap = (float(v) for v in np.mean(parts, axis=0))
    comm = dp_comm_seconds(config, cand, overlap)
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
    model_flags = config.model.model_flags()
    flags = model_flags + ([] if {"--bf16", "--fp16"} & set(model_flags) else ["--bf16"]) + [
        "--tensor-model-parallel-size", str(cand.tp),
        "--pipeline-model-parallel-size", str(cand.pp),
        "--pipeline-schedule", cand.schedule, "--num-model-chunks", str(cand.num_chunks),
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
    if cand.selective_offload:
        flags.append("--selective-offload")
    if cand.group_size is not None:
        flags += ["--microbatch-group-size-per-virtual-pipeline-stage", str(cand.group_size)]
    flags += stage_layout(config, cand).flags  # uneven or accounted stages
    if post_validated(config, cand):
        flags.append(POST_VALIDATION_FLAG)
    if config.plan_costs_path is not None:
        flags += ["--cost-model", config.plan_costs_path]
    return flags


REFINED = 12
"""Candidates whose memory :func:`plan` takes from ``PlanConfig.rank_memory`` (the dry
run's model, seconds each), fastest first, until this many fit; the rest keep the
closed-form estimate (:func:`_peak_bytes`)."""


def _predict_fitting(config: PlanConfig, cand: Candidate) -> Prediction:
    """:func:`predict`; a candidate that does not fit memory is tried again without
    post-validation's snapshot and with --recompute-lgd, and the best kept."""
    pred = predict(config, cand)
    if pred.fits:
        return pred
    retries = [cand] + ([Candidate(**{**vars(cand), "post_validation": False})]
                        if post_validated(config, cand) else [])
    for base in retries:
        again = Candidate(**{**vars(base), "recompute": True})
        for retry in ([base] if base is not cand else []) + \
                ([again] if _may_fit(config, again) else []):
            pred = min(pred, predict(config, retry),
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
    fitting = functools.partial(_predict_fitting, rough)
    out = _order(try_chunks(rough, _order(out), fitting, megatron_default))
    out = _order(try_uneven(rough, out, fitting))
    if config.rank_memory is not None:
        out = _order(_refine(config, out))
    default = next((p for p in out if p.megatron_default), None)
    return out, default


def rank(config: PlanConfig, cands: list[Candidate], *,
         refine: int | None = REFINED) -> list[Prediction]:
    """Given candidates (a view's axes, e.g. ``odc-pp tune-offload``'s), each predicted as
    it is (no recompute retry, only the one without post-validation's snapshot; those that
    cannot run are left out), ordered as
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
    """:func:`predict`; a post-validated candidate that does not fit is tried again
    without post-validation's snapshot, the better kept."""
    try:
        pred = predict(config, cand)
        if not pred.fits and post_validated(config, cand):
            pred = min(pred, predict(config, Candidate(**{**vars(cand),
                                                          "post_validation": False})),
                       key=lambda p: (not p.fits, -p.tokens_per_s))
        return pred
    except ValueError:  # shape the schedule or sample assignment rejects
        return None


def pipeline_costs(config: PlanConfig, cand: Candidate) -> CostModel:
    """The costs the first replica of the first sampled minibatch is simulated with (its
    own microbatches; collective lock step aside): what a test re-simulates."""
    _check_memo(config)
    shapes = drawn_plans(config, cand, sample_cost(config.model))[0].shapes[0]
    return replica_costs(config, cand, shapes, _pipeline_link(config, cand),
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
            base = Candidate(**{**vars(pred.candidate), "recompute": False,
                                "post_validation": True})
            pred, default = _predict_fitting(config, base), pred.megatron_default
            pred.megatron_default = default
            fitting += pred.fits
            default_done |= default
        out.append(pred)
    return out


def _key(cand: Candidate) -> tuple:
    return (cand.tp, cand.cp, cand.pp, cand.schedule, cand.dp_mode, cand.balance,
            cand.token_cap or 0, cand.micro_batch, cand.recompute, cand.offloaded,
            cand.keep_sp_input_for_w, cand.uneven or (0, 0), cand.num_chunks,
            cand.accounted, cand.group_size or 0, cand.selective_offload,
            cand.post_validation)
