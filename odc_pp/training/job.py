"""The job: the flags of ``pretrain_gpt.py`` resolved once for a world of processes.

:meth:`TrainingArgs.resolve` (``Job.resolve``) is called once per entry point
(``python -m odc_pp.train``, the dry run, the memory plan). It resolves the layout
(:class:`~odc_pp.layout.ParallelLayout`: sizes and the data-parallel mode), fills in what
depends on the job's size (Megatron's default ``--global-batch-size``, samples as
iterations), checks every flag combination that depends on it, and makes the training
schedule's :class:`~odc_pp.schedule.build.ScheduleRequest` (the one lookup of
``--pipeline-schedule``). The Job is frozen; everything after reads ``job.layout.mode``,
``job.schedule.family`` and ``job.args``, never the flags as given. The one later change
of the layout, the CUDA-IPC fallback of ``--dp-mode odc``, makes a new Job
(:meth:`Job.with_layout`), which checks the flags again against the mode that runs.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

from odc_pp.layout import ParallelLayout
from odc_pp.schedule.build import ScheduleRequest
from odc_pp.schedule.generators import Family
from odc_pp.schedule.generators.gaps import DEFAULT_FILL_EVALUATIONS
from odc_pp.schedule.ir import Placement
from odc_pp.schedule.placement import last_stage_rank
from odc_pp.schedule.stage_layout import StageLayout

from .model_facts import ties_embeddings

__all__ = ["Job", "training_request", "stage_layout_of"]

# ``TrainingArgs`` (``args``) and ``ScheduleArgs`` are named, not imported: the flag
# sections import this module (TrainingArgs.resolve), so it imports none of them.


@dataclass(frozen=True, kw_only=True)
class Job:
    """The flags resolved for one world of processes (made by :meth:`resolve`)."""

    args: "TrainingArgs"  # noqa: F821 (see the module's imports)
    """The parsed flags with what depends on the job's size filled in; read-only here on
    (a copy: the args given to :meth:`resolve` are not changed)."""
    layout: ParallelLayout
    """Sizes and the data-parallel mode the job runs."""
    schedule: ScheduleRequest
    """The training schedule at one microbatch (``with_microbatches`` gives the others):
    the --pipeline-schedule family resolved to its registry row."""
    notes: tuple[str, ...] = ()
    """What parsing and resolving decided, for the log (rank 0 prints them)."""

    @classmethod
    def resolve(cls, args: "TrainingArgs", world: int,  # noqa: F821
                local_world: int | None = None) -> Job:
        """The job of ``args`` over ``world`` processes (``local_world`` per host:
        torchrun --nproc-per-node); a ValueError naming the flags when a combination
        that depends on the job's size does not hold."""
        layout = ParallelLayout.resolve(args.parallel, world, local_world)
        args = copy.deepcopy(args)
        notes = list(args.resolution_notes)
        notes += _fill_size_defaults(args, layout.dp)
        _check_against_layout(args, layout)
        stages = stage_layout_of(args, layout.pp)
        if stages.uneven:
            notes.append(f"note: uneven pipeline stages: decoder layers per virtual stage "
                         f"{list(stages.counts())}")
        request = training_request(
            args.schedule, pp=layout.pp, num_microbatches=1,
            post_validation=args.schedule.enable_optimizer_post_validation)
        return cls(args=args, layout=layout, schedule=request, notes=tuple(notes))

    def with_layout(self, layout: ParallelLayout) -> Job:
        """This job on ``layout`` (the CUDA-IPC fallback's), the flags checked again
        against its mode."""
        if layout == self.layout:
            return self
        _check_against_layout(self.args, layout)
        return dataclasses.replace(self, layout=layout)

    @property
    def family(self) -> Family:
        """The schedule family's registry row."""
        return self.schedule.family

    @property
    def placement(self) -> Placement:
        """How the family places virtual stages on pipeline ranks."""
        return self.schedule.family.placement

    @property
    def num_chunks(self) -> int:
        """Model chunks per pipeline rank."""
        return self.schedule.num_chunks

    @property
    def stage_layout(self) -> StageLayout:
        """The decoder layers of every virtual stage (even, or Megatron's uneven stages)."""
        return stage_layout_of(self.args, self.layout.pp)

    @property
    def timeout_s(self) -> float:
        """Every wait on a peer and every process group: --distributed-timeout-minutes."""
        return self.args.parallel.distributed_timeout_minutes * 60

    @property
    def last_stage(self) -> int:
        """The pipeline rank of the last virtual stage (it reports the loss)."""
        return last_stage_rank(self.placement, self.layout.pp, self.num_chunks)

    @property
    def tied_last_stage(self) -> int | None:
        """The pipeline rank of the last stage when the model ties its output layer to
        the embedding of another stage (Megatron's default; the topology then makes the
        tied groups); None when it does not."""
        if self.layout.pp * self.num_chunks == 1 or not ties_embeddings(self.args.model):
            return None
        return self.last_stage


def stage_layout_of(args, pp: int) -> StageLayout:
    """The layer layout of ``args`` (``TrainingArgs``) over ``pp`` pipeline ranks:
    --num-layers, --num-model-chunks, --decoder-first/last-pipeline-num-layers,
    --account-for-embedding/loss-in-pipeline-split."""
    par = args.parallel
    return StageLayout.resolve(args.model.num_layers, pp, args.schedule.num_model_chunks,
                               first=par.decoder_first_pipeline_num_layers,
                               last=par.decoder_last_pipeline_num_layers,
                               account_embedding=par.account_for_embedding_in_pipeline_split,
                               account_loss=par.account_for_loss_in_pipeline_split)


def training_request(schedule, *, pp: int, num_microbatches: int,
                     post_validation: bool = False) -> ScheduleRequest:
    """The request ``pretrain_gpt.py`` runs for the schedule flags ``schedule``
    (``TrainingArgs.schedule``): compute (with any OFFLOAD/RELOAD of --offload-chunks),
    explicit communication and, with ``post_validation``, each rank's POST_VALIDATION
    point; with --fill-pipeline-gaps, W's moved into its gaps."""
    return ScheduleRequest.of(schedule.pipeline_schedule, pp=pp,
                              num_microbatches=num_microbatches,
                              num_chunks=schedule.num_model_chunks,
                              memory_limit=schedule.memory_limit,
                              offload_chunks=schedule.offload_chunks,
                              group_size=schedule
                              .microbatch_group_size_per_virtual_pipeline_stage,
                              selective_offload=schedule.selective_offload,
                              post_validation=post_validation,
                              fill_gaps=DEFAULT_FILL_EVALUATIONS
                              if schedule.fill_pipeline_gaps else 0)


def _fill_size_defaults(args, dp: int) -> list[str]:
    """Megatron's default --global-batch-size (micro batch x dp) and what follows from
    it (samples as iterations); the notes saying so."""
    from .megatron_semantics import resolve_lengths

    if args.data.global_batch_size is not None:
        return []
    args.data.global_batch_size = args.data.micro_batch_size * dp
    before = list(args.resolution_notes)
    resolve_lengths(args)
    return [f"note: no --global-batch-size: --micro-batch-size {args.data.micro_batch_size} "
            f"x data-parallel size {dp} = {args.data.global_batch_size}, as Megatron"] + \
        [note for note in args.resolution_notes if note not in before]


def _check_against_layout(args, layout: ParallelLayout) -> None:
    """Every flag combination that depends on the job's size or its data-parallel mode
    (the one home of these checks); a ValueError naming the flags."""
    from .rampup import rampup_of

    data, dp, tp = args.data, layout.dp, layout.tp
    ramp = rampup_of(data)
    problem = ramp.divisibility_problem(data.micro_batch_size, dp) if ramp else None
    if problem:
        raise ValueError(problem)
    if args.model.hf_checkpoint is None and args.model.vocab_size is not None and \
            args.model.vocab_size % tp:
        raise ValueError(f"--vocab-size {args.model.vocab_size} is not divisible by "
                         f"--tensor-model-parallel-size {tp}")
    stage_layout_of(args, layout.pp)  # the uneven stages' checks
    chunks = args.schedule.num_model_chunks
    if dp > 1 and layout.mode.is_collective and data.load_balance == "lb-mini" and chunks > 1:
        raise ValueError(
            f"--dp-mode collective with --load-balance lb-mini needs equal microbatch "
            f"counts on every replica when a pipeline rank runs several model chunks "
            f"(--pipeline-schedule {args.schedule.pipeline_schedule}, {chunks} chunks): use "
            f"--load-balance balanced or none, --dp-mode odc, or a one-chunk schedule")
    if dp > 1 and layout.mode.is_ddp and data.load_balance == "lb-mini":
        raise ValueError(
            "--dp-mode ddp needs equal microbatch counts on every replica (its "
            "reduce-scatters overlap the last backward), which --load-balance lb-mini does "
            "not give: add --load-balance balanced (or none)")
    if layout.mode.is_ddp and args.parallel.odc_param_residency == "layer":
        raise ValueError("--odc-param-residency layer frees ODC's gathered parameters; "
                         "--dp-mode ddp keeps every parameter replicated: drop the flag")
    if args.parallel.dynamic_context_parallel and not layout.mode.is_odc:
        raise ValueError(f"--dynamic-context-parallel needs --dp-mode odc (the replicas' "
                         f"slot counts differ); the job runs --dp-mode {layout.mode}")
    if data.max_tokens_per_microbatch is None and \
            data.global_batch_size % (data.micro_batch_size * dp):
        raise ValueError(f"--global-batch-size {data.global_batch_size} must be a multiple of "
                         f"--micro-batch-size {data.micro_batch_size} x data-parallel size "
                         f"{dp} (or use --max-tokens-per-microbatch)")
    if data.global_batch_size < dp:
        raise ValueError(f"--global-batch-size {data.global_batch_size} is smaller than the "
                         f"data-parallel size {dp}")
