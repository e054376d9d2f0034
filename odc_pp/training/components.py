"""Builds what one rank trains with -- model chunks (odc_pp.megatron), the data-parallel
engine (odc_pp.odc), the sharded optimizer, lowered pipeline schedules (odc_pp.schedule)
and the one pipeline runtime (odc_pp.runtime). Each builder takes only the argument
section(s) it reads; :class:`~odc_pp.training.trainer.Trainer` runs the step with them."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from odc_pp.layout import ParallelLayout
from odc_pp.optim.loss_scale import LossScaler, build_loss_scaler
from odc_pp.optim.step import OptimizerStep
from odc_pp.schedule.costs import CostModel, with_full_recompute
from odc_pp.schedule.ir import Placement

from .arguments import (ModelArgs, OptimizerArgs, ParallelArgs, ScheduleArgs, TrainingArgs,
                        loss_scale_config)
from .distributed import Topology
from .model_setup import load_initial_weights, model_config
from .odc_settings import odc_config
from .hooks import TrainingHooks
from .job import Job, stage_layout_of
from .model_stats import ZeroCountingStep
from .optimizer_step import build_optimizer_step
from .schedules import Schedules

if TYPE_CHECKING:
    from odc_pp.odc.engine import ShardedDataParallel
    from odc_pp.odc.sharded_optimizer import ShardedAdamW
    from odc_pp.runtime.runtime import PipelineRuntime

__all__ = ["Components", "build_components", "load_cost_model", "cuda_ipc_layout",
           "recompute_costs", "build_model", "build_engine", "build_optimizer"]


@dataclass(kw_only=True)
class Components:
    """What one rank trains with."""

    chunks: list[torch.nn.Module]
    """This rank's model chunks (virtual stages), in local chunk order."""
    engine: ShardedDataParallel
    """The data-parallel engine that shards the chunks' parameters and gradients."""
    optimizer: ShardedAdamW
    """AdamW over the engine's owned shards."""
    runtime: PipelineRuntime
    """The PipelineRuntime: runs every schedule of this rank's chunks."""
    schedules: Schedules
    """The lowered training and evaluation schedules per microbatch count, under the
    current cost model (ZB-auto re-planning replaces it)."""
    last_stage: bool
    """This rank runs the last virtual stage (reports the loss)."""
    optimizer_step: OptimizerStep
    """The step the runtime takes when a minibatch's gradients are final: synchronous, or
    post-validated (--enable-optimizer-post-validation)."""
    loss_scaler: LossScaler | None = None
    """--fp16: the loss scale (:mod:`odc_pp.optim.loss_scale`; checkpointed)."""

    @property
    def costs(self) -> CostModel:
        """Cost model the schedules are generated for."""
        return self.schedules.costs

    def close(self) -> None:
        self.engine.destroy()


def load_cost_model(schedule: ScheduleArgs) -> CostModel:
    """The CostModel of --cost-model (uniform costs without one)."""
    if not schedule.cost_model:
        return CostModel()
    try:
        with open(schedule.cost_model) as handle:
            return CostModel.from_dict(json.load(handle))
    except (OSError, json.JSONDecodeError, TypeError) as exc:
        raise ValueError(f"--cost-model {schedule.cost_model!r}: {exc}") from exc


def recompute_costs(costs: CostModel, args: TrainingArgs, pp: int,
                    placement: Placement) -> CostModel:
    """The costs the schedules are made for: each virtual stage's times scaled by its
    layers (uneven stages: --decoder-first/last-pipeline-num-layers) and, with full
    recompute, T_B of each virtual stage grown by the forward of its recomputed layers
    (the schedules and ZB-auto's first plan take it into account; ZB-auto's re-plans
    measure it); ``placement``: the schedule family's."""
    from odc_pp.megatron.full_recompute import recompute_groups
    from odc_pp.schedule.costs import with_stage_sizes
    from odc_pp.schedule.placement import locate

    model, layout = args.model, stage_layout_of(args, pp)
    ranks = [locate(placement, pp, layout.num_chunks, stage)[0]
             for stage in range(layout.num_stages)]
    costs = with_stage_sizes(costs, layout.relative_sizes(), ranks)
    if not model.recompute_full:
        return costs
    fractions = []
    for layers in layout.counts():
        groups = recompute_groups(layers, model.recompute_method, model.recompute_num_layers)
        fractions.append(sum(len(group) for group in groups) / layers)
    return with_full_recompute(costs, fractions, ranks)


def _last_stage_here(job: Job, topo: Topology) -> bool:
    """This rank runs the last stage and reports the loss (tp rank 0: every tp rank of
    the last stage computes the same losses)."""
    return job.last_stage == topo.pp_rank and topo.tp_rank == 0


def _dp_groups(topo: Topology):
    """(ODC group ranks' torch group, inter-host torch group or None) of ``topo``'s
    data-parallel mode: the dp x cp group; hierarchical: one host's ranks, and the
    collectives between hosts."""
    if not topo.dp_mode.is_hierarchical:
        return topo.gradient_group, None
    return topo.dp_intra_group, topo.dp_inter_group


def cuda_ipc_layout(topo: Topology, check=None) -> ParallelLayout:
    """The layout the job runs: ``--dp-mode odc`` on GPUs that cannot map each other's
    memory (CUDA IPC) falls back to collective (ParallelLayout.without_cuda_ipc; rank 0
    prints why). Collective over all ranks (every rank takes the same decision).
    ``check``: ``cuda_ipc_problem`` (tests pass a mock)."""
    layout = topo.layout
    if layout.mode.transport == "collective" or topo.device.type != "cuda" or topo.dp == 1:
        return layout
    if check is None:
        from odc_pp.odc.transport_cuda import cuda_ipc_problem as check
    problem = check(topo.dp_group, topo.device)
    problems = [None] * dist.get_world_size()
    dist.all_gather_object(problems, problem)
    problem = next((p for p in problems if p), None)
    if problem is None:
        return layout
    layout = layout.without_cuda_ipc(problem)
    if topo.rank == 0:
        print(f"pretrain_gpt.py: {layout.fallback}", flush=True)
    return layout


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


def _tie_embeddings(engine, chunks, topo: Topology) -> bool:
    """A model tied across stages: the engine sums the embedding's and the output
    layer's gradients over the tied group (the data-parallel ranks -- all, or one
    host's -- of the first and the last stage). True when this model is tied across
    stages."""
    from odc_pp.megatron.model import tied_embedding_params

    if not any(chunk.tied_across_stages for chunk in chunks):
        return False
    params = tied_embedding_params(chunks)
    if params and topo.tied_group is None:  # would train the two copies apart
        raise RuntimeError(f"rank {topo.rank} holds a tied embedding copy but its topology "
                           f"has no tied group: build it with Topology.for_job(job, ...)")
    if topo.tied_group is not None:
        engine.tie(params, topo.tied_group)
    return True


def build_model(model: ModelArgs, schedule: ScheduleArgs, parallel: ParallelArgs,
                topo: Topology, *, placement: Placement, vocab_size: int, seed: int,
                load_weights: bool = True) -> list[torch.nn.Module]:
    """This rank's model chunks: ``schedule``'s chunks placed as ``placement`` (the
    family's) over ``topo``, tensor-parallel as ``parallel`` says, seeded or with the
    --hf-checkpoint weights (not read with ``load_weights=False``: the memory dry run
    needs only their sizes)."""
    from odc_pp.megatron.model import build_chunks
    from odc_pp.megatron.tp import TensorParallel

    config = dataclasses.replace(
        model_config(model, vocab_size=vocab_size, device=str(topo.device),
                     num_stages=topo.pp * schedule.num_model_chunks),
        num_layers_in_first_pipeline_stage=parallel.decoder_first_pipeline_num_layers,
        num_layers_in_last_pipeline_stage=parallel.decoder_last_pipeline_num_layers,
        account_for_embedding_in_pipeline_split=parallel.account_for_embedding_in_pipeline_split,
        account_for_loss_in_pipeline_split=parallel.account_for_loss_in_pipeline_split)
    tensor_parallel = TensorParallel(group=topo.tp_group,
                                     sequence_parallel=parallel.sequence_parallel,
                                     keep_sp_input_for_w=parallel.keep_sp_input_for_w)
    chunks = build_chunks(config, pp_rank=topo.pp_rank, pp_size=topo.pp,
                          num_chunks=schedule.num_model_chunks,
                          placement=placement, seed=seed, tensor_parallel=tensor_parallel,
                          process_groups=topo.megatron_groups,
                          cp_group=topo.cp_group, cp_comm_type=parallel.cp_comm_type)
    if load_weights:
        load_initial_weights(chunks, model, config)
    if topo.rank == 0 and topo.device.type == "cuda":
        print(f"pretrain_gpt.py: kernels: {_kernel_summary(chunks)}", flush=True)
    return chunks


def _kernel_summary(chunks: list[torch.nn.Module]) -> str:
    """Which fused kernels the chunks run (--fused-swiglu, --fused-rope,
    --fused-cross-entropy), for the log: a GPU run says what it measured."""
    from odc_pp.megatron.swiglu import SwiGLU

    swiglu = [m.fused for chunk in chunks for m in chunk.modules() if isinstance(m, SwiGLU)]
    rope = any(getattr(chunk, "fused_rope", False) for chunk in chunks)
    fused_ce = any(getattr(chunk, "fused_cross_entropy", False) for chunk in chunks)
    return ", ".join([
        f"swiglu {'triton' if swiglu and all(swiglu) else 'eager' if swiglu else '-'}",
        f"rope {'triton' if rope else 'megatron'}",
        f"cross entropy {'fused' if fused_ce else 'unfused'}"])


def build_engine(parallel: ParallelArgs, chunks: list[torch.nn.Module], topo: Topology, *,
                 param_dtype: str, odc_group=None, param_residency: str = "minibatch",
                 keep_embedding: bool = False) -> ShardedDataParallel:
    """The data-parallel engine over ``chunks`` (the job's mode: ``topo.dp_mode``).
    ``odc_group``: an ODC group made already (the memory dry run's FakeOdcGroup); None:
    a new one over the data-parallel ranks. ``param_residency``: resolved (odc_config);
    ``keep_embedding``: layer residency keeps the embedding (plan_memory.embedding_kept)."""
    from odc_pp.odc import primitives as prim
    from odc_pp.odc.engine import ShardedDataParallel

    torch_group, inter_host = _dp_groups(topo)
    if odc_group is None:
        transport = prim.TransportConfig(
            backend=topo.dp_mode.transport,
            timeout_s=parallel.distributed_timeout_minutes * 60,
            deterministic=not parallel.nondeterministic_dp)
        odc_group = prim.new_group(torch_group, config=transport)
    if odc_group.world_size == 1 or topo.dp_mode.is_ddp:
        param_residency = "minibatch"  # nothing is gathered at dp=1; ddp replicates
    engine_class = ShardedDataParallel
    if topo.dp_mode.is_ddp:
        from odc_pp.odc.ddp import ReplicatedDataParallel as engine_class
    engine = engine_class(chunks, odc_config(parallel, topo.dp_mode,
                                                    param_dtype=param_dtype,
                                                    param_residency=param_residency),
                                 odc_group, process_group=torch_group,
                                 layers=[chunk.residency_modules(
                                     keep_embedding=keep_embedding) for chunk in chunks],
                                 inter_host_group=inter_host)
    return engine


def build_optimizer(optimizer: OptimizerArgs, engine: ShardedDataParallel, topo: Topology, *,
                    norm_group, tied: bool = False) -> ShardedAdamW:
    """AdamW over the engine's shards; biases and norms are not decayed. ``tied``: the
    model is tied across stages (the output layer's copy stays out of the norm).
    --decoupled-lr: the embedding and output-layer weights step at the decoupled rate."""
    from odc_pp.megatron.model import EMBEDDING_WEIGHT, OUTPUT_WEIGHT
    from odc_pp.odc.sharded_optimizer import AdamWConfig, ShardedAdamW

    decoupled = None if optimizer.decoupled_lr is None else \
        (lambda name, shape: name in (EMBEDDING_WEIGHT, OUTPUT_WEIGHT))
    config = AdamWConfig(lr=optimizer.lr, betas=(optimizer.adam_beta1, optimizer.adam_beta2),
                         eps=1e-8, weight_decay=optimizer.weight_decay,
                         no_decay=lambda name, shape: len(shape) == 1, decoupled=decoupled)
    return ShardedAdamW(engine, config, norm_group=norm_group,
                        counts_in_norm=_counts_in_norm(topo, tied))


def build_components(job: Job, topo: Topology, *, vocab_size: int,
                     param_residency: str = "minibatch", keep_embedding: bool = False,
                     hooks: TrainingHooks | None = None) -> Components:
    """Model, engine, optimizer, its step, runtime and schedules of this rank of the
    resolved ``job``; ``param_residency``: --odc-param-residency resolved
    (plan_memory.param_residency), ``keep_embedding`` (plan_memory.embedding_kept);
    ``hooks``: may wrap the optimizer step (the tests'
    faults)."""
    from odc_pp.runtime.runtime import PipelineRuntime, RuntimeConfig

    args = job.args
    chunks = build_model(args.model, args.schedule, args.parallel, topo,
                         placement=job.placement, vocab_size=vocab_size, seed=args.run.seed)
    engine = build_engine(args.parallel, chunks, topo, param_dtype=args.model.compute_dtype,
                          param_residency=param_residency, keep_embedding=keep_embedding)
    tied = _tie_embeddings(engine, chunks, topo)
    optimizer = build_optimizer(args.optimizer, engine, topo, norm_group=topo.norm_group,
                                tied=tied)
    timeout_s = job.timeout_s
    loss_scaler = build_loss_scaler(loss_scale_config(args.optimizer)) \
        if args.model.fp16 else None
    post_validation = args.schedule.enable_optimizer_post_validation
    optimizer_step = build_optimizer_step(optimizer, args.optimizer,
                                          post_validation=post_validation,
                                          loss_scaler=loss_scaler, timeout_s=timeout_s,
                                          device=topo.device)
    optimizer_step = (hooks or TrainingHooks()).optimizer_step(optimizer_step, engine=engine,
                                                               topo=topo)
    if args.logging.log_num_zeros_in_grad:  # counted when the gradients are final
        optimizer_step = ZeroCountingStep(optimizer_step, optimizer)
    runtime = PipelineRuntime(
        RuntimeConfig(device=str(topo.device), comm_timeout_s=timeout_s,
                      track_activations=True if args.logging.log_activation_memory
                      else None), chunks=chunks,
        pp_group=topo.pp_group, dp_hooks=engine, optimizer_step=optimizer_step,
        channels=topo.pp_channels)
    costs = recompute_costs(load_cost_model(args.schedule), args, topo.pp, job.placement)
    schedules = Schedules(job.schedule, costs, pp_group=topo.pp_group, tp_group=topo.tp_group,
                          dp_rank=topo.dp_rank)
    return Components(chunks=chunks, engine=engine, optimizer=optimizer, runtime=runtime,
                      schedules=schedules, last_stage=_last_stage_here(job, topo),
                      optimizer_step=optimizer_step, loss_scaler=loss_scaler)
