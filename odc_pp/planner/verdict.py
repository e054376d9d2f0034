"""One verdict on memory (issue 48): the dry-run command of a planned job, as
``odc-pp plan`` prints it, so that ``pretrain_gpt.py --dry-run`` judges exactly what the
plan judged -- the same flags, the fullest pipeline rank, the same budget
(:func:`~odc_pp.planner.hardware.memory_budget_gb`).

The dry run models ODC's memory (``--dp-mode odc``): a collective candidate's memory is
predicted, and dry-run, with ``--dp-mode odc`` (:func:`memory_flags`)."""

from __future__ import annotations

from collections.abc import Sequence

from odc_pp.layout import layout_rank

from .config import Prediction

__all__ = ["memory_flags", "fullest_pipeline_rank", "dry_run_command", "budget_flags"]

DATA_FLAGS = ("--mock-data", "--data-path")
"""Flags that name the training data; one of them must be given to ``pretrain_gpt.py``."""


def memory_flags(flags: Sequence[str]) -> list[str]:
    """``flags`` as the memory model and the dry run read them: ``--dp-mode`` collective
    or hierarchical as ``odc`` (the dry run models ODC's sharding for them; ``ddp``, whose
    parameters are replicated, is kept) and ``--mock-data`` unless a data flag is given
    (the memory does not depend on the data's source)."""
    out = list(flags)
    for i, flag in enumerate(out[:-1]):
        if flag == "--dp-mode" and out[i + 1] != "ddp":
            out[i + 1] = "odc"
    if not set(DATA_FLAGS) & set(out):
        out.append("--mock-data")
    return out


def fullest_pipeline_rank(pred: Prediction) -> tuple[int, int]:
    """(pipeline rank, global rank) of ``pred``'s fullest pipeline rank: its predicted
    peak is the plan's ``mem GB``; the global rank is its tp, cp and dp rank 0."""
    peaks = pred.peak_memory_gb
    pp_rank = max(range(len(peaks)), key=peaks.__getitem__)
    c = pred.candidate
    return pp_rank, layout_rank(dp_rank=0, pp_rank=pp_rank, tp_rank=0, pp=c.pp, tp=c.tp,
                                cp=c.cp)


def budget_flags(gpu: str, memory_gb: float | None) -> list[str]:
    """The dry run's flags for the plan's budget: ``--memory-gb`` when given, else the
    GPU kind (``--dry-run-gpu``), whose budget is the plan's."""
    if memory_gb is not None:
        return ["--memory-gb", f"{memory_gb:g}"]
    return ["--dry-run-gpu", gpu]


def dry_run_command(pred: Prediction, *, gpus: int, budget: Sequence[str]) -> list[str]:
    """``pretrain_gpt.py`` argv of the dry run of ``pred``'s fullest pipeline rank on
    ``gpus`` GPUs with the budget flags ``budget`` (:func:`budget_flags`)."""
    _, rank = fullest_pipeline_rank(pred)
    return ["pretrain_gpt.py", *memory_flags(pred.flags), "--dry-run",
            "--dry-run-world-size", str(gpus), "--dry-run-rank", str(rank), *budget]
