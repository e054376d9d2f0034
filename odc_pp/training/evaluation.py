"""Evaluation (``--eval-interval``, ``--eval-iters``): the validation loss, forward only.

Evaluation ``k`` (at iteration ``k * eval_interval``) runs the validation global batches
``(k - 1) * eval_iters`` .. ``k * eval_iters - 1`` (indices past the data cycle through
it in a fresh seeded order each epoch, :class:`~odc_pp.data.ShuffledSource`), so a
resumed run evaluates on exactly the batches of an uninterrupted one. Each batch is
planned like a training batch (:class:`~odc_pp.training.data_plan.BatchAssigner`) and runs
through the forward-only pipeline of the training schedule's family
(:class:`~odc_pp.training.schedules.Schedules`, built with ``forward_only``: every
rank's F actions in training order, so every layout and placement works). The loss is
token-weighted like the training loss: ``sum(token losses * loss mask) / scored
tokens`` over all the evaluation's batches. Parameters are gathered by the data-parallel
engine as in training; nothing is accumulated and the optimizer is untouched.

A stop (SIGTERM, --exit-duration-in-mins) goes before evaluation: the trainer skips an
evaluation due after the iteration at which the stop was decided, and ``stop`` (the
collective stop agreement) is asked before every batch, so a signal that comes during an
evaluation cuts it short (:func:`evaluate` returns None) and the save runs in the grace
period.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .arguments import TrainingArgs
from .context_split import split_microbatch
from .data_plan import BatchAssigner
from .distributed import Topology

__all__ = ["EvalStats", "evaluate", "due", "eval_record", "eval_size_note", "samples_in"]


@dataclass(kw_only=True)
class EvalStats:
    """One evaluation's result (the same on every rank)."""

    loss: float
    """Token-weighted mean loss over the evaluation's batches."""
    tokens: float
    """Scored tokens the loss averages over."""
    batches: int
    """Validation global batches evaluated."""


def samples_in(source) -> int | None:
    """Distinct samples of a validation source (a shuffled dataset or a blend of them);
    None for the endless synthetic corpus."""
    if hasattr(source, "sources"):  # a blend: the sum of its datasets
        parts = [samples_in(part) for part in source.sources]
        return None if None in parts else sum(parts)
    dataset = getattr(source, "dataset", source)
    return len(dataset) if hasattr(dataset, "__len__") else None


def eval_size_note(args: TrainingArgs, source) -> str | None:
    """A start-up warning when one evaluation (--eval-iters global batches) needs more
    samples than the validation data holds. The count is kept, as Megatron keeps it (its
    validation dataset is built with --eval-iters x global batch samples per evaluation,
    repeating the data): lowering it silently would change what the loss averages over."""
    size, batch = samples_in(source), args.data.global_batch_size
    if size is None or not batch or args.data.eval_iters * batch <= size:
        return None
    needed = args.data.eval_iters * batch
    return (f"warning: --eval-iters {args.data.eval_iters} x --global-batch-size {batch} = "
            f"{needed} samples per evaluation, but the validation data holds {size}: each "
            f"evaluation reads it {needed / size:.3g} times over (cycling, as Megatron "
            f"does). --eval-iters {max(size // batch, 1)} reads each sample at most once")


def due(args: TrainingArgs, done: int, batches: BatchAssigner | None) -> bool:
    """Evaluate after iteration ``done`` (1-based)?"""
    return batches is not None and args.data.eval_iters > 0 and \
        done % args.data.eval_interval == 0


def evaluate(parts, args: TrainingArgs, topo: Topology, batches: BatchAssigner,
             evaluation: int, *, stop: Callable[[], bool] | None = None) -> EvalStats | None:
    """Evaluation number ``evaluation`` (1-based) on ``batches``'s validation source.
    Collective over all ranks. ``stop``: asked before every batch (collective, the same
    answer on every rank); True cuts the evaluation short and returns None."""
    first = (evaluation - 1) * args.data.eval_iters
    loss_sum = torch.zeros(1, dtype=torch.float64)
    tokens = 0.0
    for chunk in parts.chunks:  # no dropout (and no dropout RNG drawn), as Megatron
        chunk.eval()
    try:
        for batch in range(first, first + args.data.eval_iters):
            if stop is not None and stop():
                return None
            batch_sum, batch_tokens = _batch_loss_sum(parts, args, topo, batches, batch)
            loss_sum += batch_sum
            tokens += batch_tokens
    finally:
        for chunk in parts.chunks:
            chunk.train()
    dist.all_reduce(loss_sum)
    return EvalStats(loss=float(loss_sum) / tokens, tokens=tokens,
                     batches=args.data.eval_iters)


def _batch_loss_sum(parts, args: TrainingArgs, topo: Topology, batches: BatchAssigner,
                    batch: int) -> tuple[float, float]:
    """(this rank's share of validation batch ``batch``'s masked token-loss sum -- the
    last stage's, 0 elsewhere --, the batch's scored tokens)."""
    plan = batches.plan(batch)
    microbatches = [split_microbatch(mb, topo.cp_rank, topo.cp)
                    for mb in batches.microbatches(plan.replicas[topo.dp_rank])]
    schedule = parts.schedules.evaluation(len(microbatches))
    result = parts.runtime.run_minibatch(
        schedule, microbatches, global_num_tokens=int(round(plan.total_loss_tokens)),
        max_microbatches=plan.max_microbatches, forward_only=True)
    return ((result.loss_sum or 0.0) if parts.last_stage else 0.0), plan.total_loss_tokens


def eval_record(done: int, stats: EvalStats) -> dict:
    """The logged record of an evaluation after iteration ``done``."""
    return {"iteration": done, "eval_loss": stats.loss,
            "eval_ppl": math.exp(min(stats.loss, 700.0)), "eval_tokens": stats.tokens}
