"""The training loop as one object: :meth:`Trainer.train_step` is the algorithm of one
iteration -- data plan -> pipeline schedule -> the minibatch through the runtime (the
data-parallel engine opens and closes it, and the runtime takes the optimizer step when
the gradients are final: :mod:`odc_pp.training.optimizer_step`) -> loss and statistics -- and :meth:`Trainer.train` runs the iterations with the named steps around
them (logging, post-validation resolution, evaluation, checkpoints, the exit interval).

Loss. Each iteration's loss is the token-weighted mean over the whole global batch:
``sum(token losses * loss mask) / scored tokens of the global batch``. Every microbatch's
summed token loss is divided by that global count (known to every rank from the data
plan), and gradients are *summed* over microbatches, replicas and stages, so the gradient
is independent of how samples are split into replicas and microbatches: pp x dp runs
match a single-process run up to float rounding.

Post-validation (--enable-optimizer-post-validation): an iteration's step is validated
during the next one, so its :class:`StepStats` stay pending (``grad_norm`` None) until
then; its log record and checks wait for that, and every rank finishes the same
iterations. Before a checkpoint, at the exit interval and at the end the pending step is
validated at once.
"""

from __future__ import annotations

import math
import os
import random
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from odc_pp.data.lanes import slots_digest
from odc_pp.data.record_checks import data_notes

from .checkpoint import Checkpointer
from .components import Components, build_components
from .context_split import split_microbatch
from .data_plan import (BatchAssigner, IterationPlan, build_source, build_valid_source,
                        tokenizer_log_line)
from .data_position import DataPosition
from .distributed import Topology
from .evaluation import due as eval_due, eval_record, eval_size_note, evaluate
from .logging_utils import TrainingLogger, tensorboard_settings, wandb_settings
from .model_stats import ModelStats
from .lr_schedule import LRSchedule
from .odc_settings import device_memory
from .plan_memory import embedding_kept, param_residency
from .hooks import TrainingHooks
from .job import Job
from .preemption import ExitController, ExitDecision
from .replanning import Replanner, check_same_digest
from .tracing import TraceRecorder
from .throughput import (ModelShape, default_peak_tflops, microbatch_flops, peak_allocated_mb,
                         peak_memory_mb)

__all__ = ["Trainer", "StepStats", "TrainingStopped"]


class TrainingStopped(RuntimeError):
    """Training cannot usefully go on (non-finite loss, too many skipped steps); every rank
    raises it at the same iteration because it decides on globally reduced values."""


@dataclass(kw_only=True)
class Window:
    """Throughput since the last log record (this rank)."""

    tokens: int = 0
    """Input positions of the global batches."""
    time_s: float = 0.0
    """Wall time of the steps."""
    flops: float = 0.0
    """This rank's share of the model FLOPs."""


@dataclass(kw_only=True)
class StepStats:
    """One iteration's results on this rank."""

    iteration: int
    """Iterations done after this one (1-based)."""
    lr: float
    """Learning rate of the step."""
    loss: float | None = None
    """Token-weighted mean loss of the global batch (None until :meth:`resolve_loss`)."""
    grad_norm: float | None = None
    """Global gradient norm before clipping; None while the post-validated step awaits
    its validation."""
    skipped: bool | None = None
    """The optimizer step was skipped or rolled back (inf/nan); None while pending."""
    step_s: float = 0.0
    """Wall time of the iteration."""
    busy_s: float = 0.0
    """This rank's time in compute actions."""
    peak_activation_mb: float = -1.0
    """Peak bytes of saved activations the runtime held (its count, every device); -1:
    not counted (logged as None; --log-activation-memory counts them)."""
    wgrad_held_mb: float = 0.0
    """Largest bytes one (chunk, microbatch)'s deferred W held from its B, in MiB."""
    tokens: int = 0
    """Input positions of the global batch."""
    flops: float = 0.0
    """This rank's share of its replica's model FLOPs."""
    microbatches_per_replica: list[int] = field(default_factory=list)
    """Microbatch count of every data-parallel replica."""
    schedule: object = None
    """The lowered schedule this rank ran."""
    repeats: int = 0
    """Times the minibatch ran again because the previous step was rolled back/clipped."""
    minibatch: object = None
    minibatch_started: float = 0.0
    """``perf_counter`` when the runtime's action clock started (its timings' zero)."""
    """The runtime's MinibatchResult (action timings, for the profiler)."""
    previous_step: object = None
    """Post-validation: the StepOutcome of the previous iteration's step, validated
    during this iteration (None otherwise)."""
    window: Window | None = None
    """The throughput window this iteration closed (set when its record is due)."""
    loss_reduction: tuple | None = None
    """(work or None, loss tensor, token count) of the loss all-reduce in flight."""
    loss_scale: float | None = None
    """--fp16: the loss scale after this step's update (what Megatron logs)."""
    model_stats: object = None
    """--log-params-norm / --log-num-zeros-in-grad: this rank's local sums
    (:meth:`ModelStats.local`), taken when the iteration's record is due."""

    @property
    def pending(self) -> bool:
        """The step awaits its validation (grad_norm and skipped unknown)."""
        return self.grad_norm is None

    def resolve_step(self, outcome) -> None:
        """Fill in the step from its (validated) StepOutcome; None: the step is deferred
        (post-validation) and stays pending."""
        if outcome is None:
            return
        self.grad_norm = outcome.grad_norm
        self.skipped = outcome.action == "skipped"

    def resolve_loss(self) -> None:
        """Wait for the loss all-reduce and set :attr:`loss`."""
        if self.loss_reduction is None:
            return
        work, loss_sum, tokens = self.loss_reduction
        self.loss_reduction = None
        if work is not None:
            work.wait()
        self.loss = float(loss_sum) / tokens


_GATHERED = ("busy_s", "idle_s", "peak_activation_mb", "peak_memory_mb",
             "peak_allocated_mb", "symmetric_mb", "window_flops", "window_time",
             "wgrad_held_mb")
"""The per-rank values every log record gathers from every rank."""


def _counted(value: float) -> float | None:
    """A gathered statistic that ranks report as -1 when they did not count it."""
    return None if value < 0 else value


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2 ** 32))
    torch.manual_seed(seed)


class Trainer:
    """Trains the resolved ``job`` on ``topo``: builds the data plan, the components and
    the checkpointing, resuming from --load; :meth:`train` runs the iterations."""

    def __init__(self, job: Job, topo: Topology, *, out=sys.stdout,
                 hooks: TrainingHooks | None = None) -> None:
        args = job.args
        self.job, self.args, self.topo, self.out = job, args, topo, out
        self.hooks = hooks or TrainingHooks()
        """Before each iteration and around the optimizer step (the tests' faults)."""
        self.exits = ExitController.for_args(args)  # SIGTERM etc.: finish, save, exit
        self.stop = ExitDecision(stop=False)
        seed_everything(args.run.seed)
        self._plan_data()
        self._build_parts()
        self._open_logs()
        self.records: list[dict] = []
        self.window = Window()
        self.shape = ModelShape.of(args.model, self.vocab)
        self.peak_tflops = args.logging.peak_tflops or default_peak_tflops(topo.device)
        self.skipped_in_a_row = 0
        self.skipped_since_log = 0
        """Skipped steps since the last log record (Megatron's "number of skipped
        iterations")."""
        self.replanner = Replanner(job, topo)
        self.tracer = TraceRecorder(args.logging.trace, topo) if args.logging.trace else None
        self.render_pending = bool(args.logging.schedule_png) and topo.rank == 0
        self.pending: StepStats | None = None
        """Post-validation: the step awaiting its validation in the next iteration."""
        self.last_schedule = None
        """The schedule the last iteration ran (the picture and the trace draw it)."""

    def _plan_data(self) -> None:
        """The training and validation data, their plans and the data position; what was
        dropped or truncated, said once."""
        args, topo = self.args, self.topo
        source, self.vocab = build_source(args)
        self._say(tokenizer_log_line(args, self.vocab))
        self.position = DataPosition.of(args.data)  # the samples consumed; --load moves it
        self.batches = BatchAssigner(args, source, dp=topo.dp, pp=topo.pp,
                                   segment_attention=topo.device.type == "cuda",
                                   position=self.position)
        valid = build_valid_source(args)
        self.eval_batches = BatchAssigner(args, valid, dp=topo.dp, pp=topo.pp,
                                        segment_attention=topo.device.type == "cuda") \
            if valid else None
        """Plans the validation batches (--eval-iters > 0 and a validation split)."""
        for note in dict.fromkeys(data_notes(source) + data_notes(valid)):
            self._say(note)  # dropped records, samples truncation left unscored
        if valid and (note := eval_size_note(args, valid)):
            self._say(note)  # --eval-iters beyond the validation data

    def _build_parts(self) -> None:
        """The components (with the parameter residency the memory plan resolves), the
        learning-rate schedule and the checkpointer, resumed from --load."""
        args, topo = self.args, self.topo
        job, out = self.job, self.out
        budget = device_memory(topo.device)
        residency = param_residency(job, budget_bytes=budget)
        self.parts: Components = build_components(
            job, topo, vocab_size=self.vocab, param_residency=residency, hooks=self.hooks,
            keep_embedding=embedding_kept(job, residency, budget_bytes=budget))
        if args.parallel.odc_param_residency == "auto" and residency == "layer":
            self._say("--odc-param-residency auto: layer (the memory plan of minibatch "
                      "residency exceeds the GPU's memory; each layer is gathered per use)")
        opt = args.optimizer
        self.lr_schedule = LRSchedule(lr=opt.lr, min_lr=opt.min_lr,
                                      warmup_iters=opt.lr_warmup_iters,
                                      decay_iters=opt.lr_decay_iters, style=opt.lr_decay_style,
                                      decoupled_lr=opt.decoupled_lr,
                                      decoupled_min_lr=opt.decoupled_min_lr)
        self.checkpointer = Checkpointer(job, topo, self.parts, vocab_size=self.vocab,
                                         say=self._say, out=out, position=self.position)
        self.start = self.checkpointer.load()

    def _open_logs(self) -> None:
        """The log (rank 0) and the optional per-step model statistics."""
        args, topo, out = self.args, self.topo, self.out
        self.logger = TrainingLogger(
            train_iters=args.run.train_iters, log_json=args.logging.log_json,
            tensorboard_dir=args.logging.tensorboard_dir,
            progress_bar=not args.logging.no_progress_bar, stream=out,
            **tensorboard_settings(args), **wandb_settings(args)) if topo.rank == 0 else None
        self.model_stats = ModelStats(
            self.parts, params_norm=args.logging.log_params_norm,
            zeros=args.logging.log_num_zeros_in_grad,
            timeout_s=self.job.timeout_s) \
            if args.logging.log_params_norm or args.logging.log_num_zeros_in_grad else None

    # ----- the loop -------------------------------------------------------------------
    def train(self) -> list[dict]:
        """Iterations from the start (0, or where --load resumed) to --train-iters or
        --exit-interval; returns the logged records (rank 0; other ranks: [])."""
        for iteration in range(self.start, self.args.run.train_iters):
            self.hooks.before_iteration(iteration, self.topo)
            stats = self.train_step(iteration)
            self.stop = self.exits.should_exit(stats.iteration)  # collective: same on all
            self._observe(stats)
            if self._settle(stats):
                self._finish(stats)
                self._evaluate_if_due(stats.iteration)
                self.checkpointer.save_if_due(stats.iteration, stopping=self.stop.stop)
            if self._exit_due(stats.iteration):
                self._say(self.stop.reason or
                          f"exit interval {self.args.run.exit_interval} reached")
                break
        self.close()
        return self.records

    def train_step(self, iteration: int) -> StepStats:
        """One iteration (``iteration``: 0-based): plan -> schedule -> minibatch (the
        runtime takes the optimizer step when the gradients are final) -> loss and
        statistics. A deferred (post-validated) step leaves the stats pending."""
        plan = self.batches.plan(iteration)
        whole = self.batches.microbatches(plan.replicas[self.topo.dp_rank])
        microbatches = self._context_parallel_part(plan.replicas[self.topo.dp_rank], whole)
        schedule = self.parts.schedules.training(len(microbatches))
        self.last_schedule = schedule
        lr = self._lr_at(iteration)
        began = time.perf_counter()
        stats = StepStats(iteration=iteration + 1, lr=lr, tokens=plan.total_tokens,
                          microbatches_per_replica=[len(r) for r in plan.replicas],
                          schedule=schedule)
        result = self._run_minibatch(schedule, microbatches, plan, lr, stats)
        stats.resolve_step(result.step)
        if self.parts.loss_scaler is not None:
            stats.loss_scale = self.parts.loss_scaler.scale
        if self.model_stats is not None and self._record_due(iteration + 1):
            stats.model_stats = self.model_stats.local()
        self._start_loss_reduction(stats, result, plan)
        stats.step_s = time.perf_counter() - began
        if self.tracer is not None:
            self.tracer.record(iteration + 1, began, stats.step_s, stats)
        stats.busy_s = sum(t.duration for t in result.timings if t.action.is_compute)
        stats.peak_activation_mb = result.peak_activation_bytes / 2 ** 20 \
            if self.parts.runtime.tracks_activations else -1.0
        held = getattr(result, "wgrad_bytes", None) or {}
        stats.wgrad_held_mb = max(held.values(), default=0) / 2 ** 20
        # this rank's share of its replica's model FLOPs (the replica's pp ranks split it)
        stats.flops = sum(microbatch_flops(self.shape, mb) for mb in whole) / (
            self.topo.pp * self.topo.cp)
        return stats

    # ----- inside the step ------------------------------------------------------------
    def _context_parallel_part(self, rows, whole):
        """Context parallelism: this rank's part of every sequence (the same samples on
        every cp rank of the replica); --dynamic-context-parallel: its microbatch of every
        slot (split rows, own lane rows)."""
        if self.args.parallel.dynamic_context_parallel:
            slots = self.batches.lane_slots(rows, lanes=self.topo.cp)
            check_same_digest(slots_digest(slots), self.topo.cp_group,
                              what="variable-CP slot plan",
                              hint="every context-parallel rank must plan the same slots "
                                   "-- check that all ranks read the same data")
            return self.batches.lane_microbatches(slots, lane=self.topo.cp_rank,
                                                  lanes=self.topo.cp)
        return [split_microbatch(mb, self.topo.cp_rank, self.topo.cp) for mb in whole]

    def _lr_at(self, iteration: int) -> float:
        """The rate of ``iteration``: that of the consumed samples in global batches
        (Megatron's schedule counts samples; the iteration while the batch is constant)."""
        return self.lr_schedule.lr_at(self.position.schedule_iteration(iteration))


    def _run_minibatch(self, schedule, microbatches, plan: IterationPlan, lr: float,
                       stats: StepStats):
        """The minibatch through the runtime; with post-validation again while the
        previous step's validation rolled it back or clipped it."""
        while True:
            result = self.parts.runtime.run_minibatch(
                schedule, microbatches, global_num_tokens=int(round(plan.total_loss_tokens)),
                max_microbatches=plan.max_microbatches, step_lr=lr,
                loss_scale=self.parts.loss_scaler.scale if self.parts.loss_scaler else 1.0)
            stats.previous_step = stats.previous_step or result.validated
            stats.minibatch = result
            stats.minibatch_started = time.perf_counter() - result.wall_time
            if not result.repeat:
                return result
            stats.repeats += 1


    def _start_loss_reduction(self, stats: StepStats, result, plan: IterationPlan) -> None:
        """Sum the last stage's loss over all ranks; with post-validation in the
        background (no barrier at the end of the iteration; waited for when finished)."""
        loss_sum = torch.tensor([result.loss_sum or 0.0 if self.parts.last_stage else 0.0],
                                dtype=torch.float64)
        work = dist.all_reduce(loss_sum, async_op=self.parts.optimizer_step.deferred)
        stats.loss_reduction = (work, loss_sum, plan.total_loss_tokens)
        if work is None:
            stats.resolve_loss()

    # ----- around the step ------------------------------------------------------------

    def _observe(self, stats: StepStats) -> None:
        """After every step: the schedule picture, re-planning, progress and the
        throughput window."""
        if self.render_pending:  # the schedule rank 0's pipeline just ran
            self._render_schedule()
            self.render_pending = False
        if not self.stop.stop and self.replanner.observe(  # stopping: no re-planning
                self.parts, stats, max_microbatches=max(stats.microbatches_per_replica),
                out=self.out if self.topo.rank == 0 else None):
            self.render_pending = bool(self.args.logging.schedule_png) and self.topo.rank == 0
        self.window.tokens += stats.tokens
        self.window.time_s += stats.step_s
        self.window.flops += stats.flops
        if self.logger is not None:
            self.logger.progress(stats.iteration)
        if self._log_due(stats.iteration):
            stats.window, self.window = self.window, Window()

    def _settle(self, stats: StepStats) -> bool:
        """Post-validation: finish the previous step, validated during this one, and
        validate this one at once before a checkpoint, the exit or the end. True when
        ``stats`` are final; otherwise they wait for the next iteration."""
        if self.pending is not None:
            self.pending.resolve_step(stats.previous_step)
            self._finish(self.pending)
            self.pending = None
        done = stats.iteration
        if stats.pending and (self.checkpointer.due(done, stopping=self.stop.stop) or self._exit_due(done)
                              or eval_due(self.args, done, self.eval_batches)
                              or done == self.args.run.train_iters):
            stats.resolve_step(self.parts.optimizer_step.validate())
        if stats.pending:
            self.pending = stats
            return False
        return True

    def _finish(self, stats: StepStats) -> None:
        """A final step: its loss, its log record when due, the stop checks."""
        stats.resolve_loss()
        scaler = self.parts.loss_scaler
        # --fp16 dynamic scaling: an overflow lowers the scale, it counts once at the floor
        counts = stats.skipped and not (scaler is not None and scaler.dynamic
                                        and not scaler.at_floor)
        self.skipped_in_a_row = self.skipped_in_a_row + 1 if counts else 0
        self.skipped_since_log += bool(stats.skipped)
        if self._record_due(stats.iteration):
            self._log(stats)
        check_finite(stats, stats.iteration, self.skipped_in_a_row, self.args)

    def _log_due(self, done: int) -> bool:
        return done % self.args.logging.log_interval == 0 or done == self.args.run.train_iters

    def _record_due(self, done: int) -> bool:
        """A record is built: the log line is due, or TensorBoard's scalars."""
        logging = self.args.logging
        return self._log_due(done) or bool(
            logging.tensorboard_dir and done % logging.tensorboard_log_interval == 0)

    def _outside_bytes(self) -> int:
        """The ODC group's CUDA symmetric buffers (outside torch's allocator)."""
        group = getattr(self.parts.engine, "group", None)
        return group.device_bytes() if hasattr(group, "device_bytes") else 0

    def _log(self, stats: StepStats) -> None:
        """Gather every rank's statistics; rank 0 logs the record."""
        window = stats.window or Window(tokens=stats.tokens, time_s=stats.step_s,
                                        flops=stats.flops)  # a TensorBoard-only record
        outside = self._outside_bytes()
        mine = {"busy_s": stats.busy_s, "idle_s": stats.step_s - stats.busy_s,
                "peak_activation_mb": stats.peak_activation_mb,
                "peak_memory_mb": peak_memory_mb(self.topo.device, outside),
                "peak_allocated_mb": peak_allocated_mb(self.topo.device, outside),
                "symmetric_mb": outside / 2 ** 20,
                "window_flops": window.flops, "window_time": window.time_s,
                "wgrad_held_mb": stats.wgrad_held_mb}
        ranks = self._gather(mine)
        tflops = sum(r["window_flops"] / max(r["window_time"], 1e-9) for r in ranks) \
            / self.topo.world_size / 1e12
        record = {"iteration": stats.iteration, "loss": stats.loss, "lr": stats.lr,
                  "grad_norm": stats.grad_norm,
                  "tokens_per_s": window.tokens / max(window.time_s, 1e-9),
                  "tflops_per_device": tflops,
                  "mfu": tflops / self.peak_tflops if self.peak_tflops else None,
                  "step_s": stats.step_s, "busy_s": [r["busy_s"] for r in ranks],
                  "idle_s": [r["idle_s"] for r in ranks],
                  "peak_activation_mb": _counted(max(r["peak_activation_mb"] for r in ranks)),
                  "peak_memory_mb": max(r["peak_memory_mb"] for r in ranks),
                  "peak_allocated_mb": max(r["peak_allocated_mb"] for r in ranks),
                  "symmetric_mb": max(r["symmetric_mb"] for r in ranks),
                  # bytes one (chunk, microbatch)'s deferred W holds from its B
                  "wgrad_held_mb": max(r["wgrad_held_mb"] for r in ranks),
                  "skipped": stats.skipped,
                  "skipped_iterations": self.skipped_since_log,
                  "loss_scale": stats.loss_scale,
                  "microbatches_per_replica": stats.microbatches_per_replica}
        # Megatron's iteration line
        record["global_batch_size"] = self.position.batch_size_of(stats.iteration - 1)
        record["consumed_samples"] = self.position.consumed_before(stats.iteration)
        if stats.model_stats is not None:
            record.update(self.model_stats.record(stats.model_stats, stats.skipped))
        if not self._log_due(stats.iteration):  # TensorBoard's scalars only
            if self.logger is not None:
                self.logger.write_tensorboard(record)
            return
        self.skipped_since_log = 0
        if self.logger is not None:
            self.logger.log(record)
            self.records.append(record)

    def _gather(self, values: dict[str, float]) -> list[dict[str, float]]:
        """Every rank's ``values`` (the :data:`_GATHERED` names) on every rank."""
        local = torch.tensor([values[name] for name in _GATHERED], dtype=torch.float64)
        out = [torch.zeros_like(local) for _ in range(self.topo.world_size)]
        dist.all_gather(out, local)
        return [dict(zip(_GATHERED, t.tolist())) for t in out]

    def _render_schedule(self) -> None:
        """The schedule this rank's pipeline runs, simulated under the costs, as a PNG."""
        from odc_pp.schedule.render import render_png
        from odc_pp.schedule.simulator import simulate

        path, schedule = self.args.logging.schedule_png, self.last_schedule
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        render_png(schedule, simulate(schedule, self.parts.costs), path)
        self._say(f"schedule picture ({schedule.name}, {schedule.num_microbatches} "
                  f"microbatches): {path}")

    def _evaluate_if_due(self, done: int) -> None:
        """--eval-interval: the validation loss after iteration ``done`` (every rank;
        rank 0 logs it)."""
        if not eval_due(self.args, done, self.eval_batches):
            return
        if not self.stop.stop:  # a stop decided during it cuts it short: the save first
            stats = evaluate(self.parts, self.args, self.topo, self.eval_batches,
                             done // self.args.data.eval_interval,
                             stop=lambda: self.exits.should_exit(done).stop)
            self.stop = self.exits.decision
        if self.stop.stop:
            self._say(f"evaluation after iteration {done} skipped or cut short, saving "
                      f"first: {self.stop.reason}")
            return
        if self.logger is not None:
            self.logger.log_eval(eval_record(done, stats))

    # ----- the end -------------------------------------------------------------------
    def _exit_due(self, done: int) -> bool:
        return bool(self.args.run.exit_interval and done >= self.args.run.exit_interval) \
            or self.stop.stop

    def _say(self, message: str) -> None:
        if self.topo.rank == 0:
            print(message, file=self.out, flush=True)

    def close(self) -> None:
        if self.logger is not None:
            self.logger.close()
        if self.tracer is not None:
            self.tracer.close(self.last_schedule,
                              out=self.out if self.topo.rank == 0 else None)
        self.parts.close()
        self.checkpointer.close()
        self.exits.finish()  # raises TrainingInterrupted after a signal stop


def check_finite(stats, done: int, skipped_in_a_row: int, args: TrainingArgs) -> None:
    """Raise :class:`TrainingStopped` on a non-finite loss or after --max-skipped-steps
    skipped steps in a row (every rank alike: both are global values)."""
    if not math.isfinite(stats.loss):
        raise TrainingStopped(
            f"iteration {done}: the loss is {stats.loss}. Likely cause: the learning rate "
            f"is too high for this model (--lr {args.optimizer.lr}); lower --lr, add warmup "
            f"(--lr-warmup-iters) or clipping (--clip-grad), or check the data")
    if skipped_in_a_row >= args.optimizer.max_skipped_steps:
        raise TrainingStopped(
            f"iteration {done}: {skipped_in_a_row} optimizer steps in a row were skipped "
            f"because the gradients were inf/nan (--max-skipped-steps "
            f"{args.optimizer.max_skipped_steps}). Likely cause: diverged weights from too high a "
            f"learning rate (--lr {args.optimizer.lr}), overflow in --bf16, or --fp16 "
            f"overflowing at its --min-loss-scale")
