"""Builds what one rank trains with -- model chunks (odc_pp.megatron), the data-parallel
engine (odc_pp.odc), the sharded optimizer, pipeline schedules (odc_pp.schedule) and the
pipeline runtime (odc_pp.runtime) -- and runs one iteration with them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from odc_pp.data import Microbatch
from odc_pp.schedule.costs import CostModel
from odc_pp.schedule.generators import family, training_schedule
from odc_pp.schedule.ir import Placement, Schedule
from odc_pp.schedule.placement import last_stage_rank

from .arguments import ScheduleArgs, TrainingArgs
from .data_plan import IterationPlan
from .distributed import Topology
from .model_setup import load_initial_weights, model_config
from .optimizer_step import (build_post_validator, inject_nonfinite_grad, norm_groups,
                             post_validated_step, synchronous_step)

__all__ = ["Components", "IterationResult", "build_components", "run_iteration",
           "build_schedule"]


@dataclass
class IterationResult:
    loss: float
    """Token-weighted mean loss of the global batch."""
    grad_norm: float
    """Global gradient norm before clipping."""
    busy_s: float
    """This rank's time in compute actions."""
    peak_memory_mb: float
    """Peak device memory of this rank (CPU: peak saved-activation memory)."""
    skipped: bool = False
    """The optimizer step was rolled back (post-validation found inf/nan)."""
    minibatch: object = None
    """The runtime's MinibatchResult (action timings, for the profiler)."""


@dataclass
class Components:
    chunks: list
    engine: object
    optimizer: object
    runtime: object
    costs: CostModel
    """Cost model the schedules are generated for."""
    last_stage: bool
    """This rank runs the last virtual stage (reports the loss)."""
    runtimes: dict = field(default_factory=dict)
    """Pipeline runtime per microbatch count (LB-Mini varies it between iterations)."""
    post_validator: object = None
    """PostValidatedOptimizer around ``optimizer`` (--enable-optimizer-post-validation)."""

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


def build_schedule(schedule: ScheduleArgs, *, pp: int, num_microbatches: int,
                   costs: CostModel) -> Schedule:
    """The compute schedule (with any OFFLOAD/RELOAD) for one replica's microbatch count;
    the runtime issues the communication itself."""
    return training_schedule(schedule.pipeline_schedule, pp=pp,
                             num_microbatches=num_microbatches,
                             num_chunks=schedule.num_model_chunks, costs=costs,
                             memory_limit=schedule.memory_limit,
                             offload_chunks=schedule.offload_chunks)


def _last_stage_here(args: TrainingArgs, topo: Topology) -> bool:
    return last_stage_rank(placement_of(args.schedule.pipeline_schedule), topo.pp,
                           args.schedule.num_model_chunks) == topo.pp_rank


def _dp_groups(args: TrainingArgs, topo: Topology, env_local_world: int):
    """(ODC group ranks' torch group, inter-host torch group or None). Collective:
    every rank creates every group in the same order."""
    if args.parallel.dp_mode != "hierarchical":
        return topo.dp_group, None
    per_host = args.parallel.dp_ranks_per_host or max(1, env_local_world // topo.pp)
    if topo.dp % per_host:
        raise ValueError(f"--dp-ranks-per-host {per_host} does not divide the data-parallel "
                         f"size {topo.dp}")
    intra = inter = None
    for stage in range(topo.pp):
        members = [replica * topo.pp + stage for replica in range(topo.dp)]
        for host in range(topo.dp // per_host):
            group = dist.new_group(members[host * per_host:(host + 1) * per_host])
            if stage == topo.pp_rank and host == topo.dp_rank // per_host:
                intra = group
        for slot in range(per_host):
            group = dist.new_group(members[slot::per_host])
            if stage == topo.pp_rank and slot == topo.dp_rank % per_host:
                inter = group
    return intra, inter


def build_components(args: TrainingArgs, topo: Topology, *, vocab_size: int,
                     local_world_size: int = 1) -> Components:
    from odc_pp.megatron.model import build_chunks
    from odc_pp.odc import primitives as prim
    from odc_pp.odc.engine import OdcConfig, ShardedDataParallel
    from odc_pp.odc.sharded_optimizer import AdamWConfig, ShardedAdamW

    dtype = "bfloat16" if args.model.bf16 else "float32"
    model = model_config(args, vocab_size=vocab_size, device=str(topo.device),
                         num_stages=topo.pp * args.schedule.num_model_chunks)
    chunks = build_chunks(model, pp_rank=topo.pp_rank, pp_size=topo.pp,
                          num_chunks=args.schedule.num_model_chunks,
                          placement=placement_of(args.schedule.pipeline_schedule), seed=args.run.seed)
    load_initial_weights(chunks, args, model)
    torch_group, inter_host = _dp_groups(args, topo, local_world_size)
    timeout_s = args.parallel.distributed_timeout_minutes * 60
    transport = prim.TransportConfig(
        backend="collective" if args.parallel.dp_mode == "collective" else "odc",
        timeout_s=timeout_s, deterministic=not args.parallel.nondeterministic_dp)
    odc_group = prim.new_group(torch_group, config=transport)
    engine = ShardedDataParallel(chunks, OdcConfig(mode=args.parallel.dp_mode, unit_driver="pipeline",
                                                   param_dtype=dtype),
                                 odc_group, process_group=torch_group,
                                 inter_host_group=inter_host)
    optimizer = ShardedAdamW(engine, AdamWConfig(
        lr=args.optimizer.lr, betas=(args.optimizer.adam_beta1, args.optimizer.adam_beta2), eps=1e-8,
        weight_decay=args.optimizer.weight_decay, no_decay=lambda name, shape: len(shape) == 1),
        norm_group=norm_groups(topo, torch_group))
    parts = Components(chunks=chunks, engine=engine, optimizer=optimizer, runtime=None,
                       costs=load_cost_model(args.schedule),
                       last_stage=_last_stage_here(args, topo))
    if args.schedule.enable_optimizer_post_validation:
        parts.post_validator = build_post_validator(parts, args, topo)
    return parts


def _runtime_for(parts: Components, args: TrainingArgs, topo: Topology,
                 num_microbatches: int):
    from odc_pp.runtime.runtime import PipelineRuntime, RuntimeConfig

    runtime = parts.runtimes.get(num_microbatches)
    if runtime is None:
        if num_microbatches < 1:
            raise ValueError(f"data-parallel rank {topo.dp_rank} got no microbatch; raise "
                             "--global-batch-size")
        schedule = build_schedule(args.schedule, pp=topo.pp, num_microbatches=num_microbatches,
                                  costs=parts.costs)
        config = RuntimeConfig(device=str(topo.device),
                               comm_timeout_s=args.parallel.distributed_timeout_minutes * 60)
        runtime = PipelineRuntime(config, chunks=parts.chunks, schedule=schedule,
                                  pp_group=topo.pp_group, dp_hooks=parts.engine)
        parts.runtimes[num_microbatches] = runtime
    # layers hand deferred weight gradients to the queue of the runtime that runs now
    for index, chunk in enumerate(parts.chunks):
        runtime.wgrad_queue.attach(index, chunk)
    return runtime


def run_iteration(parts: Components, args: TrainingArgs, topo: Topology,
                  microbatches: list[Microbatch], *, plan: IterationPlan,
                  lr: float, iteration: int | None = None) -> IterationResult:
    """Forward/backward of this rank's microbatches under the schedule, then the step
    (``iteration``: 1-based, for --inject-nonfinite-grad-iter)."""
    runtime = _runtime_for(parts, args, topo, len(microbatches))
    parts.engine.begin_minibatch(max_microbatches=plan.max_microbatches,
                                 num_microbatches=len(microbatches))
    result = runtime.run_minibatch(microbatches,
                                   global_num_tokens=int(round(plan.total_loss_tokens)))
    if args.run.inject_nonfinite_grad_iter == iteration and topo.rank == topo.world_size - 1:
        inject_nonfinite_grad(parts)
    parts.optimizer.config.lr = lr
    if parts.post_validator is not None:
        norm, skipped = post_validated_step(parts)
    else:
        norm, skipped = synchronous_step(parts, args)
    loss_sum = torch.tensor([result.loss_sum or 0.0 if parts.last_stage else 0.0],
                            dtype=torch.float64)
    dist.all_reduce(loss_sum)
    busy = sum(t.duration for t in result.timings if t.action.is_compute)
    if topo.device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(topo.device) / 2 ** 20
    else:  # CPU: the runtime's count of saved activations
        peak = result.peak_activation_bytes / 2 ** 20
    return IterationResult(loss=float(loss_sum) / plan.total_loss_tokens, grad_norm=norm,
                           busy_s=busy, peak_memory_mb=peak, skipped=skipped,
                           minibatch=result)
