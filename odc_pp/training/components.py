"""Builds what one rank trains with -- model chunks (odc_pp.megatron), the data-parallel
engine (odc_pp.odc), the sharded optimizer, lowered pipeline schedules (odc_pp.schedule)
and the one pipeline runtime (odc_pp.runtime) -- and runs one iteration with them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from odc_pp.data import Microbatch
from odc_pp.schedule.costs import CostModel, with_full_recompute
from odc_pp.schedule.generators import family, training_schedule
from odc_pp.schedule.ir import Placement, Schedule
from odc_pp.schedule.lowering import insert_post_validation, lower_communication
from odc_pp.schedule.placement import last_stage_rank

from .arguments import ScheduleArgs, TrainingArgs
from .data_plan import IterationPlan
from .distributed import Topology
from .model_setup import load_initial_weights, model_config
from .optimizer_step import (NonfiniteInjection, build_post_validator, inject_nonfinite_grad,
                             synchronous_step)
from .replanning import check_same_schedule

__all__ = ["Components", "IterationResult", "build_components", "run_iteration",
           "recompute_costs",
           "build_schedule", "schedule_for", "resolve_step", "resolve_loss", "validate_now"]


@dataclass
class IterationResult:
    loss: float | None
    """Token-weighted mean loss of the global batch (None until :func:`resolve_loss`)."""
    grad_norm: float | None
    """Global gradient norm before clipping; None while the post-validated step awaits
    its validation (filled in by :func:`resolve_step`)."""
    busy_s: float
    """This rank's time in compute actions."""
    peak_memory_mb: float
    """Peak device memory of this rank (CPU: peak saved-activation memory)."""
    skipped: bool | None = False
    """The optimizer step was skipped or rolled back (inf/nan); None while pending."""
    minibatch: object = None
    """The runtime's MinibatchResult (action timings, for the profiler)."""
    previous_step: object = None
    """Post-validation: the StepOutcome of the previous iteration's step, validated
    during this iteration (None otherwise)."""
    repeats: int = 0
    """Times the minibatch ran again because the previous step was rolled back/clipped."""
    loss_reduction: tuple | None = None
    """(work or None, loss tensor, token count) of the loss all-reduce in flight."""

    @property
    def pending(self) -> bool:
        """The step awaits its validation (grad_norm and skipped unknown)."""
        return self.grad_norm is None


@dataclass
class Components:
    chunks: list
    engine: object
    optimizer: object
    runtime: object
    """The PipelineRuntime: runs every schedule of this rank's chunks."""
    costs: CostModel
    """Cost model the schedules are generated for."""
    last_stage: bool
    """This rank runs the last virtual stage (reports the loss)."""
    schedules: dict = field(default_factory=dict)
    """Lowered schedule per microbatch count (LB-Mini varies it between iterations);
    cleared when the costs change (ZB-auto re-planning)."""
    post_validator: object = None
    """PostValidatedOptimizer around ``optimizer`` (--enable-optimizer-post-validation)."""
    injection: object = None
    """NonfiniteInjection inside ``post_validator`` (--inject-nonfinite-grad-iter)."""
    last_schedule: Schedule | None = None
    """The schedule the last iteration ran."""
    eval_schedules: dict = field(default_factory=dict)
    """Lowered forward-only schedule per microbatch count (evaluation)."""

    def close(self) -> None:
        self.engine.destroy()


def placement_of(schedule_name: str) -> Placement:
    return family(schedule_name).placement


def load_cost_model(schedule: ScheduleArgs) -> CostModel:
    """The CostModel of --cost-model (uniform costs without one)."""
    if not schedule.cost_model:
        return CostModel()
    try:
        with open(schedule.cost_model) as handle:
            return CostModel.from_dict(json.load(handle))
    except (OSError, json.JSONDecodeError, TypeError) as exc:
        raise ValueError(f"--cost-model {schedule.cost_model!r}: {exc}") from exc


def recompute_costs(costs: CostModel, args: TrainingArgs, pp: int) -> CostModel:
    """With full recompute, T_B of each virtual stage grows by the forward of its
    recomputed layers (the schedules and ZB-auto's first plan take it into account;
    ZB-auto's re-plans measure it)."""
    from odc_pp.megatron.full_recompute import recompute_groups
    from odc_pp.megatron.model import stage_layers
    from odc_pp.schedule.placement import locate

    model = args.model
    if not model.recompute_full:
        return costs
    chunks = args.schedule.num_model_chunks
    num_stages = pp * chunks
    fractions, ranks = [], []
    for stage in range(num_stages):
        layers = len(stage_layers(model.num_layers, num_stages, stage))
        groups = recompute_groups(layers, model.recompute_method, model.recompute_num_layers)
        fractions.append(sum(len(group) for group in groups) / layers)
        ranks.append(locate(placement_of(args.schedule.pipeline_schedule), pp, chunks,
                            stage)[0])
    return with_full_recompute(costs, fractions, ranks)


def build_schedule(schedule: ScheduleArgs, *, pp: int, num_microbatches: int,
                   costs: CostModel, post_validation: bool = False) -> Schedule:
    """The lowered schedule the runtime executes for one replica's microbatch count:
    compute (with any OFFLOAD/RELOAD), then explicit communication, then (with
    ``post_validation``) the POST_VALIDATION point of every rank."""
    compute = training_schedule(schedule.pipeline_schedule, pp=pp,
                                num_microbatches=num_microbatches,
                                num_chunks=schedule.num_model_chunks, costs=costs,
                                memory_limit=schedule.memory_limit,
                                offload_chunks=schedule.offload_chunks)
    lowered = lower_communication(compute)
    return insert_post_validation(lowered) if post_validation else lowered


def _last_stage_here(args: TrainingArgs, topo: Topology) -> bool:
    """This rank runs the last stage and reports the loss (tp rank 0: every tp rank of
    the last stage computes the same losses)."""
    return last_stage_rank(placement_of(args.schedule.pipeline_schedule), topo.pp,
                           args.schedule.num_model_chunks) == topo.pp_rank and \
        topo.tp_rank == 0


def _dp_groups(args: TrainingArgs, topo: Topology, env_local_world: int):
    """(ODC group ranks' torch group, inter-host torch group or None, gradient-norm
    group). Collective: every rank creates every group in the same order. The norm group
    holds every rank owning a disjoint piece of the gradient: all ranks, or with
    hierarchical data parallelism one host's ranks of every stage (one model copy)."""
    if args.parallel.dp_mode != "hierarchical":
        return topo.dp_group, None, dist.group.WORLD
    per_host = args.parallel.dp_ranks_per_host or \
        max(1, env_local_world // (topo.pp * topo.tp))
    if topo.dp % per_host:
        raise ValueError(f"--dp-ranks-per-host {per_host} does not divide the data-parallel "
                         f"size {topo.dp}")
    intra = inter = norm = None
    for stage in range(topo.pp):
        for tp_rank in range(topo.tp):
            members = [topo.global_rank(dp_rank=replica, pp_rank=stage, tp_rank=tp_rank)
                       for replica in range(topo.dp)]
            here = stage == topo.pp_rank and tp_rank == topo.tp_rank
            for host in range(topo.dp // per_host):
                group = dist.new_group(members[host * per_host:(host + 1) * per_host])
                if here and host == topo.dp_rank // per_host:
                    intra = group
            for slot in range(per_host):
                group = dist.new_group(members[slot::per_host])
                if here and slot == topo.dp_rank % per_host:
                    inter = group
    for host in range(topo.dp // per_host):
        replicas = range(host * per_host, (host + 1) * per_host)
        group = dist.new_group([topo.global_rank(dp_rank=replica, pp_rank=stage,
                                                 tp_rank=tp_rank)
                                for replica in replicas for stage in range(topo.pp)
                                for tp_rank in range(topo.tp)])
        if host == topo.dp_rank // per_host:
            norm = group
    return intra, inter, norm


def _counts_in_norm(topo: Topology, tied: bool = False):
    """Tensor parallelism: a replicated parameter's gradient enters the global norm from
    tp rank 0 only (every tp rank holds it whole); ``tied``: the output layer's copy of
    the embedding does not enter it (the embedding does, as in Megatron); None when every
    parameter counts."""
    from odc_pp.megatron.model import OUTPUT_WEIGHT
    from odc_pp.megatron.tp_layout import partition_of

    if topo.tp == 1 and not tied:
        return None

    def counts(name: str, shape) -> bool:
        if tied and name == OUTPUT_WEIGHT:
            return False
        # the gated flag does not change whether a parameter is split
        return topo.tp_rank == 0 or not partition_of(name, gated_mlp=False).replicated
    return counts


def _tie_embeddings(engine, chunks, args: TrainingArgs, topo: Topology,
                    env_local_world: int) -> bool:
    """A model tied across stages: the engine sums the embedding's and the output
    layer's gradients over the data-parallel ranks (one ODC group: all, or one host's) of
    the first and the last stage. Collective: every rank creates every group. True when
    this model is tied across stages."""
    from odc_pp.megatron.model import tied_embedding_params

    if not any(chunk.tied_across_stages for chunk in chunks):
        return False
    last = last_stage_rank(placement_of(args.schedule.pipeline_schedule), topo.pp,
                           args.schedule.num_model_chunks)
    per_host = topo.dp
    if args.parallel.dp_mode == "hierarchical":
        per_host = args.parallel.dp_ranks_per_host or \
            max(1, env_local_world // (topo.pp * topo.tp))
    mine = None
    for tp_rank in range(topo.tp):
        for host in range(topo.dp // per_host):
            members = sorted({topo.global_rank(dp_rank=replica, pp_rank=stage, tp_rank=tp_rank)
                              for replica in range(host * per_host, (host + 1) * per_host)
                              for stage in (0, last)})
            group = dist.new_group(members)
            if topo.rank in members:
                mine = group
    params = tied_embedding_params(chunks)
    if mine is not None:
        engine.tie(params, mine)
    return True


def build_components(args: TrainingArgs, topo: Topology, *, vocab_size: int,
                     local_world_size: int = 1) -> Components:
    from odc_pp.megatron.model import build_chunks
    from odc_pp.megatron.tp import TensorParallel
    from odc_pp.odc import primitives as prim
    from odc_pp.odc.engine import OdcConfig, ShardedDataParallel
    from odc_pp.odc.sharded_optimizer import AdamWConfig, ShardedAdamW
    from odc_pp.runtime.runtime import PipelineRuntime, RuntimeConfig

    dtype = "bfloat16" if args.model.bf16 else "float32"
    model = model_config(args, vocab_size=vocab_size, device=str(topo.device),
                         num_stages=topo.pp * args.schedule.num_model_chunks)
    tensor_parallel = TensorParallel(group=topo.tp_group,
                                     sequence_parallel=args.parallel.sequence_parallel,
                                     keep_sp_input_for_w=args.parallel.keep_sp_input_for_w)
    chunks = build_chunks(model, pp_rank=topo.pp_rank, pp_size=topo.pp,
                          num_chunks=args.schedule.num_model_chunks,
                          placement=placement_of(args.schedule.pipeline_schedule),
                          seed=args.run.seed, tensor_parallel=tensor_parallel)
    load_initial_weights(chunks, args, model)
    torch_group, inter_host, norm_group = _dp_groups(args, topo, local_world_size)
    timeout_s = args.parallel.distributed_timeout_minutes * 60
    transport = prim.TransportConfig(
        backend="collective" if args.parallel.dp_mode == "collective" else "odc",
        timeout_s=timeout_s, deterministic=not args.parallel.nondeterministic_dp)
    odc_group = prim.new_group(torch_group, config=transport)
    engine = ShardedDataParallel(chunks, OdcConfig(mode=args.parallel.dp_mode, unit_driver="pipeline",
                                                   param_dtype=dtype),
                                 odc_group, process_group=torch_group,
                                 inter_host_group=inter_host)
    tied = _tie_embeddings(engine, chunks, args, topo, local_world_size)
    optimizer = ShardedAdamW(engine, AdamWConfig(
        lr=args.optimizer.lr, betas=(args.optimizer.adam_beta1, args.optimizer.adam_beta2), eps=1e-8,
        weight_decay=args.optimizer.weight_decay, no_decay=lambda name, shape: len(shape) == 1),
        norm_group=norm_group, counts_in_norm=_counts_in_norm(topo, tied))
    post_validator = injection = None
    if args.schedule.enable_optimizer_post_validation:
        if args.run.inject_nonfinite_grad_iter is not None:
            injection = NonfiniteInjection(optimizer)
        post_validator = build_post_validator(optimizer, args, topo, injection=injection)
    runtime = PipelineRuntime(
        RuntimeConfig(device=str(topo.device), comm_timeout_s=timeout_s,
                      track_activations=True if args.logging.log_activation_memory
                      else None), chunks=chunks,
        pp_group=topo.pp_group, dp_hooks=engine, post_validator=post_validator,
        channels=topo.pp_channels)
    return Components(chunks=chunks, engine=engine, optimizer=optimizer, runtime=runtime,
                      costs=recompute_costs(load_cost_model(args.schedule), args, topo.pp),
                      last_stage=_last_stage_here(args, topo),
                      post_validator=post_validator, injection=injection)


def schedule_for(parts: Components, args: TrainingArgs, topo: Topology,
                 num_microbatches: int) -> Schedule:
    """The lowered schedule for this replica's microbatch count under ``parts.costs``."""
    if num_microbatches < 1:
        raise ValueError(f"data-parallel rank {topo.dp_rank} got no microbatch; raise "
                         "--global-batch-size")
    schedule = parts.schedules.get(num_microbatches)
    if schedule is None:
        schedule = build_schedule(args.schedule, pp=topo.pp,
                                  num_microbatches=num_microbatches, costs=parts.costs,
                                  post_validation=parts.post_validator is not None)
        # before the first step with it: every rank of the pipeline must run this plan,
        # and so must the stage's tensor-parallel ranks (their collectives inside F/B/W
        # pair up only if they run the same actions in the same order)
        check_same_schedule(schedule, topo.pp_group, what="pipeline schedule")
        if topo.tp_group is not None:
            check_same_schedule(schedule, topo.tp_group,
                                what="pipeline schedule of the tensor-parallel ranks")
        parts.schedules[num_microbatches] = schedule
    return schedule


def run_iteration(parts: Components, args: TrainingArgs, topo: Topology,
                  microbatches: list[Microbatch], *, plan: IterationPlan,
                  lr: float, iteration: int | None = None) -> IterationResult:
    """Forward/backward of this rank's microbatches under the lowered schedule, and the
    step (``iteration``: 1-based, for --inject-nonfinite-grad-iter).

    Synchronous: the step follows the minibatch; the result is final. Post-validation:
    the runtime steps eagerly at the schedule's POST_VALIDATION and validates the previous
    iteration's step there (``previous_step``); when that one was rolled back or clipped
    the minibatch runs again. The result stays pending until :func:`resolve_step` (the
    next iteration's ``previous_step``, or :func:`validate_now`)."""
    schedule = schedule_for(parts, args, topo, len(microbatches))
    parts.last_schedule = schedule
    injecting = args.run.inject_nonfinite_grad_iter == iteration and \
        topo.rank == topo.world_size - 1
    parts.optimizer.config.lr = lr  # the eager step at POST_VALIDATION uses it
    if parts.injection is not None:
        parts.injection.armed = injecting
    repeats, previous = 0, None
    try:
        while True:
            parts.engine.begin_minibatch(max_microbatches=plan.max_microbatches,
                                         num_microbatches=len(microbatches))
            result = parts.runtime.run_minibatch(
                schedule, microbatches, global_num_tokens=int(round(plan.total_loss_tokens)))
            previous = previous or result.validated
            if not result.repeat:
                break
            repeats += 1
    finally:
        if parts.injection is not None:
            parts.injection.armed = False
    norm, skipped = None, None
    if parts.post_validator is None:
        if injecting:
            inject_nonfinite_grad(parts.engine)
        norm, skipped = synchronous_step(parts, args)
    loss_sum = torch.tensor([result.loss_sum or 0.0 if parts.last_stage else 0.0],
                            dtype=torch.float64)
    # post-validation: no barrier at the end of the iteration; waited for in resolve_loss
    work = dist.all_reduce(loss_sum, async_op=parts.post_validator is not None)
    busy = sum(t.duration for t in result.timings if t.action.is_compute)
    if topo.device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(topo.device) / 2 ** 20
    else:  # CPU: the runtime's count of saved activations
        peak = result.peak_activation_bytes / 2 ** 20
    iteration_result = IterationResult(
        loss=None, grad_norm=norm, busy_s=busy, peak_memory_mb=peak, skipped=skipped,
        minibatch=result, previous_step=previous, repeats=repeats,
        loss_reduction=(work, loss_sum, plan.total_loss_tokens))
    if work is None:
        resolve_loss(iteration_result)
    return iteration_result


def resolve_loss(result: IterationResult) -> None:
    """Wait for the loss all-reduce of ``result`` (started by run_iteration) and set
    ``result.loss``."""
    if result.loss_reduction is None:
        return
    work, loss_sum, tokens = result.loss_reduction
    result.loss_reduction = None
    if work is not None:
        work.wait()
    result.loss = float(loss_sum) / tokens


def resolve_step(result: IterationResult, outcome) -> None:
    """Fill in a pending ``result`` from its step's validated StepOutcome."""
    result.grad_norm = outcome.grad_norm
    result.skipped = outcome.action == "skipped"


def validate_now(parts: Components, result: IterationResult) -> None:
    """Finish a pending post-validated step at once (before a checkpoint, at the end):
    the check, and a rollback or clipped redo if needed; no minibatch ran since."""
    if result.pending:
        resolve_step(result, parts.post_validator.validate())
