"""Uneven pipeline stages in the plan: lighter embedding and loss stages.

The first pipeline stage also runs the embedding and the last the output layer and the
loss, so with equal layers they are the pipeline's slowest; Megatron-LM's
--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers take layers off
them (:class:`~odc_pp.schedule.stage_layout.StageLayout`). :func:`uneven_variants` are the
layouts the planner tries for a candidate: one layer per model chunk off the first stage,
off the last, or off both, the middle stages taking them (pp = 2: onto the other end);
:func:`try_uneven` predicts them for the fastest candidates and keeps what runs.

Megatron's --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split
(``Candidate.accounted``) are not variants of equal stages: ``num_layers`` + 1 or 2 never
splits over ``pp x v`` virtual stages where ``num_layers`` does (but at pp 2, v 1, where
it gives the same stages), so the chunk axis prices them where the equal split does not
(:func:`~odc_pp.planner.chunks.chunk_layouts`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from odc_pp.schedule.stage_layout import StageLayout

from .config import Candidate, PlanConfig

__all__ = ["stage_layout", "uneven_variants", "try_uneven", "TRIED"]

TRIED = 4
"""Fastest pipelined candidates whose uneven variants :func:`try_uneven` predicts."""


def stage_layout(config: PlanConfig, cand: Candidate) -> StageLayout:
    """The decoder layers of each of ``cand``'s virtual stages."""
    first, last = cand.uneven or (None, None)
    return StageLayout.resolve(config.model.num_layers, cand.pp,
                               cand.num_chunks, first=first, last=last,
                               account_embedding=cand.accounted[0],
                               account_loss=cand.accounted[1])


def uneven_variants(config: PlanConfig, cand: Candidate) -> list[Candidate]:
    """``cand`` with lighter first and/or last stages (those Megatron's checks accept)."""
    chunks = cand.num_chunks
    if cand.pp < 2 or cand.uneven is not None or any(cand.accounted) or \
            config.model.num_layers % (cand.pp * chunks):
        return []
    even = config.model.num_layers // cand.pp
    lighter, heavier = even - chunks, even + chunks
    pairs = [(lighter, heavier), (heavier, lighter)] if cand.pp == 2 else \
        [(lighter, lighter), (lighter, even), (even, lighter)]
    out = []
    for first, last in pairs:
        try:
            StageLayout.resolve(config.model.num_layers, cand.pp, chunks, first=first,
                                last=last)
        except ValueError:
            continue
        out.append(replace(cand, uneven=(first, last)))
    return out


def try_uneven(config: PlanConfig, ranked: list, predict: Callable) -> list:
    """``ranked`` predictions (best first) with the uneven variants of the :data:`TRIED`
    fastest fitting pipelined ones added (``predict``: candidate -> prediction, a
    ValueError where it cannot run)."""
    chosen = [p for p in ranked if p.fits and p.candidate.pp > 1 and
              not p.megatron_default][:TRIED]
    added = []
    for pred in chosen:
        for cand in uneven_variants(config, pred.candidate):
            try:
                added.append(predict(cand))
            except ValueError:
                continue
    for pred in added:
        pred.megatron_default = False
    return ranked + added
