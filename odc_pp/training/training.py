"""The training loop: data plan -> pipeline runtime (pp) with the ODC engine (dp) ->
sharded AdamW -> logging and atomic checkpoints.

Loss. Each iteration's loss is the token-weighted mean over the whole global batch:
``sum(token losses * loss mask) / scored tokens of the global batch``. Every microbatch's
summed token loss is divided by that global count (known to every rank from the data
plan), and gradients are *summed* over microbatches, replicas and stages, so the gradient
is independent of how samples are split into replicas and microbatches: pp x dp runs
match a single-process run up to float rounding.
"""

from __future__ import annotations

import math
import os
import random
import signal
import sys
import time
import traceback

import numpy as np
import torch
import torch.distributed as dist

from .arguments import TrainingArgs, parse_args_with_notes
from .checkpointing import CheckpointSaver, capture_rng_state, restore_rng_state
from .components import (Components, build_components, build_schedule, resolve_loss,
                         resolve_step, run_iteration, validate_now)
from .data_plan import DataPlanner, build_source
from .distributed import Topology, build_topology, init_distributed, read_env
from .failures import exit_after_failure, is_peer_echo
from .logging_utils import TrainingLogger, wandb_settings
from .lr_schedule import LRSchedule
from .replanning import ZbAutoReplanner
from .resharding import sharded_state
from .resume import check_save_dir, checkpoint_meta, refuse_newer_checkpoints, resume
from .throughput import ModelShape, default_peak_tflops, microbatch_flops, peak_memory_mb

__all__ = ["main", "train", "TrainingStopped"]

EXIT_STOPPED = 3


class TrainingStopped(RuntimeError):
    """Training cannot usefully go on (non-finite loss, too many skipped steps); every rank
    raises it at the same iteration because it decides on globally reduced values."""


def _check_finite(result, done: int, skipped_in_a_row: int, args: TrainingArgs) -> None:
    if not math.isfinite(result.loss):
        raise TrainingStopped(
            f"iteration {done}: the loss is {result.loss}. Likely cause: the learning rate "
            f"is too high for this model (--lr {args.optimizer.lr}); lower --lr, add warmup "
            f"(--lr-warmup-iters) or clipping (--clip-grad), or check the data")
    if skipped_in_a_row >= args.optimizer.max_skipped_steps:
        raise TrainingStopped(
            f"iteration {done}: {skipped_in_a_row} optimizer steps in a row were skipped "
            f"because the gradients were inf/nan (--max-skipped-steps "
            f"{args.optimizer.max_skipped_steps}). Likely cause: diverged weights from too high a "
            f"learning rate (--lr {args.optimizer.lr}) or overflow in --bf16")


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2 ** 32))
    torch.manual_seed(seed)


def _gather_floats(values: list[float], topo: Topology) -> list[list[float]]:
    """Every rank's ``values`` on every rank ([rank][i])."""
    local = torch.tensor(values, dtype=torch.float64)
    out = [torch.zeros_like(local) for _ in range(topo.world_size)]
    dist.all_gather(out, local)
    return [t.tolist() for t in out]


def _render_schedule(path: str, schedule, costs, out) -> None:
    """The schedule this rank's pipeline runs, simulated under ``costs``, as a PNG."""
    from odc_pp.schedule.render import render_png
    from odc_pp.schedule.simulator import simulate

    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    render_png(schedule, simulate(schedule, costs), path)
    print(f"schedule picture ({schedule.name}, {schedule.num_microbatches} microbatches): "
          f"{path}", file=out, flush=True)


def train(args: TrainingArgs, topo: Topology, *, out=sys.stdout) -> list[dict]:
    """Train; returns the logged records (rank 0; other ranks: [])."""
    _seed_everything(args.run.seed)
    source, vocab = build_source(args)
    planner = DataPlanner(args, source, dp=topo.dp, pp=topo.pp)
    parts: Components = build_components(args, topo, vocab_size=vocab,
                                         local_world_size=read_env().local_world_size)
    schedule_lr = LRSchedule(lr=args.optimizer.lr, min_lr=args.optimizer.min_lr, warmup_iters=args.optimizer.lr_warmup_iters,
                             decay_iters=args.optimizer.lr_decay_iters, style=args.optimizer.lr_decay_style)
    start = 0
    if args.checkpoint.save:  # before the first step: fail now, not at the first save
        check_save_dir(parts, args.checkpoint, topo, out=out)
    if args.checkpoint.load:
        start, how = resume(parts, args, topo, restore_rng_state, vocab_size=vocab, out=out)
        if how and topo.rank == 0:
            print(f"resumed from {args.checkpoint.load} at iteration {start} ({how})", file=out,
                  flush=True)
    saver = None
    if args.checkpoint.save:
        refuse_newer_checkpoints(args.checkpoint, topo, start)
        saver = CheckpointSaver(args.checkpoint.save, keep=args.checkpoint.keep_checkpoints, rank=topo.rank,
                                world_size=topo.world_size, barrier=dist.barrier)
    logger = TrainingLogger(train_iters=args.run.train_iters, log_json=args.logging.log_json,
                            tensorboard_dir=args.logging.tensorboard_dir,
                            progress_bar=not args.logging.no_progress_bar, stream=out,
                            **wandb_settings(args)) if topo.rank == 0 else None
    records: list[dict] = []
    window_tokens, window_time, window_flops = 0, 0.0, 0.0
    shape = ModelShape(num_layers=args.model.num_layers, hidden_size=args.model.hidden_size,
                       ffn_hidden_size=args.model.ffn_hidden_size, vocab_size=vocab)
    peak_tflops = args.logging.peak_tflops or default_peak_tflops(topo.device)
    skipped_in_a_row = 0
    replanner = ZbAutoReplanner(args, topo, build_schedule=build_schedule)
    render_pending = bool(args.logging.schedule_png) and topo.rank == 0
    # with post-validation an iteration's step is validated during the next one: its
    # log record and checks wait for that (every rank finishes the same iterations)
    pending: dict | None = None

    def finish(entry: dict) -> None:
        nonlocal skipped_in_a_row
        result, done = entry["result"], entry["done"]
        resolve_loss(result)
        skipped_in_a_row = skipped_in_a_row + 1 if result.skipped else 0
        if done % args.logging.log_interval == 0 or done == args.run.train_iters:
            held = getattr(result.minibatch, "wgrad_bytes", None) or {}
            stats = _gather_floats([result.busy_s, entry["step_s"] - result.busy_s,
                                    result.peak_memory_mb, peak_memory_mb(topo.device),
                                    entry["window_flops"], entry["window_time"],
                                    max(held.values(), default=0) / 2 ** 20], topo)
            tflops = sum(s[4] / max(s[5], 1e-9) for s in stats) / topo.world_size / 1e12
            record = {"iteration": done, "loss": result.loss, "lr": entry["lr"],
                      "grad_norm": result.grad_norm,
                      "tokens_per_s": entry["window_tokens"] / max(entry["window_time"], 1e-9),
                      "tflops_per_device": tflops,
                      "mfu": tflops / peak_tflops if peak_tflops else None,
                      "step_s": entry["step_s"], "busy_s": [s[0] for s in stats],
                      "idle_s": [s[1] for s in stats],
                      "peak_activation_mb": max(s[2] for s in stats),
                      "peak_memory_mb": max(s[3] for s in stats),
                      # bytes one (chunk, microbatch)'s deferred W holds from its B
                      "wgrad_held_mb": max(s[6] for s in stats),
                      "skipped": result.skipped,
                      "microbatches_per_replica": entry["microbatches_per_replica"]}
            if logger is not None:
                logger.log(record)
                records.append(record)
        _check_finite(result, done, skipped_in_a_row, args)

    for iteration in range(start, args.run.train_iters):
        if args.run.inject_fault_rank == topo.rank and iteration + 1 == args.run.inject_fault_iter:
            print(f"rank {topo.rank}: injected fault at iteration {iteration + 1} (SIGKILL)",
                  file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        plan = planner.plan(iteration)
        microbatches = planner.microbatches(plan.replicas[topo.dp_rank])
        lr = schedule_lr.lr_at(iteration)
        began = time.perf_counter()
        result = run_iteration(parts, args, topo, microbatches, plan=plan, lr=lr,
                               iteration=iteration + 1)
        step_s = time.perf_counter() - began
        if render_pending:  # the schedule rank 0's pipeline just ran
            _render_schedule(args.logging.schedule_png, parts.last_schedule, parts.costs, out)
            render_pending = False
        if replanner.observe(parts, result, max_microbatches=plan.max_microbatches,
                             out=out if topo.rank == 0 else None):
            render_pending = bool(args.logging.schedule_png) and topo.rank == 0
        window_tokens += plan.total_tokens
        window_time += step_s
        # this rank's share of its replica's model FLOPs (the replica's pp ranks split it)
        window_flops += sum(microbatch_flops(shape, mb) for mb in microbatches) / topo.pp
        done = iteration + 1
        if logger is not None:
            logger.progress(done)
        entry = {"result": result, "done": done, "lr": lr, "step_s": step_s,
                 "window_tokens": window_tokens, "window_time": window_time,
                 "window_flops": window_flops,
                 "microbatches_per_replica": [len(r) for r in plan.replicas]}
        if done % args.logging.log_interval == 0 or done == args.run.train_iters:
            window_tokens, window_time, window_flops = 0, 0.0, 0.0
        if pending is not None:
            resolve_step(pending["result"], result.previous_step)
            finish(pending)
            pending = None
        due_save = saver is not None and (
            (args.checkpoint.save_interval and done % args.checkpoint.save_interval == 0)
            or done == args.run.train_iters or done == args.run.exit_interval)
        exiting = bool(args.run.exit_interval and done >= args.run.exit_interval)
        if result.pending and (due_save or exiting or done == args.run.train_iters):
            validate_now(parts, result)
        if result.pending:
            pending = entry
            continue
        finish(entry)
        if due_save:
            state = dict(sharded_state(parts.engine, parts.optimizer), rng=capture_rng_state(),
                         iteration=done)
            path = saver.save(done, state, meta=checkpoint_meta(args, topo, vocab_size=vocab))
            if topo.rank == 0:
                print(f"saved checkpoint {path}", file=out, flush=True)
        if exiting:
            if topo.rank == 0:
                print(f"exit interval {args.run.exit_interval} reached", file=out, flush=True)
            break
    if logger is not None:
        logger.close()
    parts.close()
    return records


def main(argv: list[str] | None = None) -> int:
    """Entry point of pretrain_gpt.py: 0 done, 2 bad flags, 3 stopped (non-finite
    training), 1 failure."""
    env = read_env()
    try:
        args, notes = parse_args_with_notes(argv)
        args.data_parallel_size(env.world_size, env.local_world_size)
    except ValueError as exc:
        if env.rank == 0:
            print(f"pretrain_gpt.py: error: {exc}", file=sys.stderr, flush=True)
        else:  # let rank 0 print first: torchrun stops the others when one exits
            time.sleep(3)
        return 2
    if env.rank == 0:
        for note in notes:
            print(note, flush=True)
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    try:
        device = init_distributed(env, timeout_minutes=args.parallel.distributed_timeout_minutes)
        topo = build_topology(env, args.parallel.pipeline_model_parallel_size, device,
                              tp=args.parallel.tensor_model_parallel_size)
        train(args, topo)
        dist.barrier()
    except ValueError as exc:
        print(f"pretrain_gpt.py: rank {env.rank}: error: {exc}", file=sys.stderr, flush=True)
        exit_after_failure(exc, 2)
    except TrainingStopped as exc:
        if env.rank == 0:
            print(f"pretrain_gpt.py: stopped: {exc}", file=sys.stderr, flush=True)
        exit_after_failure(exc, EXIT_STOPPED)
    except BaseException as exc:
        if is_peer_echo(exc):
            print(f"pretrain_gpt.py: rank {env.rank} failed because a peer rank went away "
                  f"({type(exc).__name__}: {exc}); the failing rank's message names the "
                  f"cause", file=sys.stderr, flush=True)
        else:
            print(f"pretrain_gpt.py: rank {env.rank} failed: {type(exc).__name__}: {exc}\n"
                  f"{traceback.format_exc(limit=4)}", file=sys.stderr, flush=True)
        exit_after_failure(exc, 1)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0

