"""Megatron-LM's semantics of the flags pretrain_gpt.py shares with it, where they need more
than a field: run and schedule lengths in samples (``--train-samples``, ``--lr-*-samples``,
``--lr-warmup-fraction``) as iterations of the global batch; flags Megatron tolerates as
no-ops in a job (``--sequence-parallel`` at tp=1, ``--split`` with ``--mock-data``); and
unknown flags as one line each (:mod:`.arguments` uses them)."""

from __future__ import annotations

import math

from .megatron_hints import unknown_line
from .rampup import rampup_of

__all__ = ["resolve_lengths", "length_conflicts", "unknown_lines", "megatron_tolerances"]


def resolve_lengths(args) -> None:
    """--train-samples, --lr-*-samples and --lr-warmup-fraction as iterations, as far
    as the global batch is known (without --global-batch-size: at
    :meth:`TrainingArgs.resolve`)."""
    run, opt, gbs = args.run, args.optimizer, args.data.global_batch_size
    if run.train_iters is None and run.train_samples is None:
        run.train_iters = 10
    converted = []
    if gbs is not None:
        converted = _samples_to_iterations(args, gbs)
    if opt.lr_decay_iters is None and opt.lr_decay_samples is None and \
            run.train_iters is not None:
        opt.lr_decay_iters = run.train_iters
    if opt.lr_warmup_fraction is not None and opt.lr_decay_iters is not None:
        opt.lr_warmup_iters = math.ceil(round(opt.lr_warmup_fraction * opt.lr_decay_iters, 6))
        converted.append(f"--lr-warmup-fraction {opt.lr_warmup_fraction} x "
                         f"--lr-decay-iters {opt.lr_decay_iters} -> --lr-warmup-iters "
                         f"{opt.lr_warmup_iters}")
    if converted:
        note = f"note: {'; '.join(converted)}"
        if gbs is not None and (run.train_samples or opt.lr_decay_samples or
                                opt.lr_warmup_samples is not None):
            note += (f" (at --global-batch-size {gbs}: samples / global batch, rounded "
                     f"up; --train-samples rounded down, as Megatron)")
        if note not in args.resolution_notes:
            args.resolution_notes.append(note)


def _samples_to_iterations(args, gbs: int) -> list[str]:
    """Megatron's sample counts as iterations of ``gbs`` samples; what was converted."""
    run, opt, converted = args.run, args.optimizer, []
    if run.train_iters is None:
        ramp = rampup_of(args.data)  # Megatron: the ramp's iterations, then whole batches
        run.train_iters = ramp.train_iters(run.train_samples) if ramp else \
            run.train_samples // gbs
        if run.train_iters < 1:
            raise ValueError(f"--train-samples {run.train_samples} is less than one "
                             f"global batch ({gbs} samples)")
        converted.append(f"--train-samples {run.train_samples} -> --train-iters "
                         f"{run.train_iters}")
    for flag, samples, name in (("--lr-decay-samples", opt.lr_decay_samples, "lr_decay_iters"),
                                ("--lr-warmup-samples", opt.lr_warmup_samples, "lr_warmup_iters")):
        if samples is not None:
            setattr(opt, name, -(-samples // gbs))
            converted.append(f"{flag} {samples} -> --{name.replace('_', '-')} {getattr(opt, name)}")
    return converted


def length_conflicts(args) -> list[str]:
    """Iterations and samples given for the same length (Megatron takes one of them)."""
    run, opt, problems = args.run, args.optimizer, []
    pairs = ((run.train_iters is not None, run.train_samples is not None,
              "--train-iters", "--train-samples"),
             (opt.lr_decay_iters is not None, opt.lr_decay_samples is not None,
              "--lr-decay-iters", "--lr-decay-samples"),
             (opt.lr_warmup_iters != 0, opt.lr_warmup_samples is not None,
              "--lr-warmup-iters", "--lr-warmup-samples"),
             (opt.lr_warmup_samples is not None or opt.lr_warmup_iters != 0,
              opt.lr_warmup_fraction is not None,
              "--lr-warmup-iters/--lr-warmup-samples", "--lr-warmup-fraction"))
    problems += [f"give one of {a} and {b}" for given_a, given_b, a, b in pairs
                 if given_a and given_b]
    if opt.lr_warmup_samples is not None and opt.lr_warmup_samples < 0:
        problems.append(f"--lr-warmup-samples must be >= 0, got {opt.lr_warmup_samples}")
    if opt.lr_warmup_fraction is not None and not 0 <= opt.lr_warmup_fraction <= 1:
        problems.append(f"--lr-warmup-fraction must be in [0, 1], got {opt.lr_warmup_fraction}")
    return problems


def unknown_lines(unknown: list[str], native: frozenset[str]) -> list[str]:
    """One line per unknown flag (its values folded in), with what it most likely meant
    (:func:`~odc_pp.training.megatron_hints.unknown_line`)."""
    lines: list[str] = []
    for token in unknown:
        if not token.startswith("--"):
            if lines and lines[-1].startswith("--"):
                continue  # a value of the unknown flag before it
            lines.append(f"unexpected argument {token!r}")
            continue
        lines.append(unknown_line(token, native))
    return lines


def megatron_tolerances(values: dict) -> list[str]:
    """Megatron flags that are no-ops in the job given: dropped with a note."""
    notes = []
    if values["sequence_parallel"] and values["tensor_model_parallel_size"] == 1:
        values["sequence_parallel"] = False
        notes.append("note: --sequence-parallel at --tensor-model-parallel-size 1: no-op "
                     "(Megatron turns it off at tp=1 too)")
    if values["split"] is not None and values["mock_data"]:
        notes.append(f"note: --split {values['split']} with --mock-data: ignored (the "
                     f"synthetic corpus has no documents to split; Megatron ignores it too)")
        values["split"] = None
    return notes
