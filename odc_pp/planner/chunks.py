"""The planner's model-chunk axis: how many model chunks per pipeline rank (Megatron's
virtual pipeline size, ``--num-model-chunks``) a candidate of a family is priced at, and
which sets of them an offloading candidate moves to host memory.

A family that takes one fixed count (1F1B, ZB-H1/H2, the V families: ``max_chunks`` 1 or
2) is priced at its ``default_chunks``. A family that takes any count (interleaved 1F1B
and offload: ``max_chunks`` None) is priced at every count ``v`` from its ``min_chunks``
up to :data:`MAX_CHUNKS` whose layer split
Megatron accepts: ``num_layers`` divisible by ``pp x v`` for equal stages; else with the
embedding and the loss counted as layers of the split
(``--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split``:
``num_layers + 2`` divisible by ``pp x v``, the first and last virtual stage one layer
lighter -- the layouts the PipeOffload and zero-bubble papers ran, 38 layers over
8 x 5 chunks; or the loss alone, else the embedding alone, at ``num_layers + 1``); and with ``--decoder-first/last-pipeline-num-layers`` where those split
into other stages, the checks of :class:`~odc_pp.schedule.stage_layout.StageLayout`
(the first and last stage's layers divisible by ``v``, the middle layers by the middle
stages x ``v``). More chunks shrink
interleaved's bubble by ``1/v`` and add ``(v-1)`` groups of in-flight activations to
warm-up; the simulator counts both from the schedule built with ``v`` chunks.

The search stays bounded: ``odc-pp plan`` first ranks each family at its default count
(or, where that does not split the layers, the smallest that does:
:func:`primary_layouts`), then prices the other counts of the :data:`TRIED` fastest
candidates and of row M's (:func:`try_chunks`), as it tries uneven stages; ``odc-pp
tune-offload`` (one layout) prices every count. For an offloading family
:func:`offload_sets` gives every non-empty set of chunks up to
:data:`ALL_SUBSETS_UP_TO` chunks, beyond that the contiguous ones that start or end a
rank's chunks (``2 v - 1`` sets: which share of the chunks leaves, from either end of
the model), not the ``2^v - 1`` subsets.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import replace

from odc_pp.schedule.generators import family
from odc_pp.schedule.stage_layout import StageLayout

from .config import Candidate, PlanConfig

__all__ = ["MAX_CHUNKS", "ALL_SUBSETS_UP_TO", "TRIED", "chunk_counts", "chunk_layouts",
           "primary_layouts", "lighter_ends", "offload_sets", "try_chunks", "NOT_ACCOUNTED",
           "BOTH_ACCOUNTED"]

MAX_CHUNKS = 8
"""Largest virtual pipeline size the planner prices (the PipeOffload paper runs up to 5;
Megatron-LM's examples 2-4): past it the bubble gained is below the extra transfers."""

NOT_ACCOUNTED = (False, False)
"""``Candidate.accounted`` of a layout counting neither the embedding nor the loss."""
BOTH_ACCOUNTED = (True, True)
"""``Candidate.accounted`` of a layout counting the embedding and the loss as layers."""

TRIED = 4
"""Fastest fitting candidates whose other chunk counts :func:`try_chunks` prices (and
the fastest Megatron default)."""

ALL_SUBSETS_UP_TO = 3
"""Chunk counts up to which an offloading candidate tries every non-empty set of chunks."""


def chunk_counts(name: str, num_layers: int, pp: int,
                 uneven: tuple[int, int] | None = None) -> list[int]:
    """The chunk counts family ``name`` is priced at for ``num_layers`` over ``pp``
    pipeline ranks (``uneven``: the first and last stage's layers), ascending; empty
    when no count splits the layers as Megatron requires."""
    return [v for v in _tried(name, num_layers, pp) if _splits(num_layers, pp, v, uneven)]


def chunk_layouts(name: str, num_layers: int,
                  pp: int) -> list[tuple[int, tuple[int, int] | None, tuple[bool, bool]]]:
    """(chunk count, uneven stages or None, (embedding, loss) accounted in the split) of
    family ``name`` at ``pp``: each count tried with equal stages where ``num_layers``
    splits evenly; else with the embedding and the loss accounted where ``num_layers + 2``
    splits (38 layers at pp 8 x 5 chunks: 0, 1 x 38, 0) -- or the loss alone, else the
    embedding alone, where ``num_layers + 1`` does --, and with the lighter first and
    last stages of :func:`lighter_ends` where those split into other stages (62 layers
    at pp 4 x 2 chunks: 16 + 16 + 16 + 14)."""
    out = []
    for v in _tried(name, num_layers, pp):
        if _splits(num_layers, pp, v, None):
            out.append((v, None, NOT_ACCOUNTED))
            continue
        which, accounted = _accounted(num_layers, pp, v)
        if accounted is not None:
            out.append((v, None, which))
        ends = lighter_ends(num_layers, pp, v)
        if ends is not None and (accounted is None or accounted != StageLayout.resolve(
                num_layers, pp, v, first=ends[0], last=ends[1]).counts()):
            out.append((v, ends, NOT_ACCOUNTED))
    return out


def _accounted(num_layers: int, pp: int,
               chunks: int) -> tuple[tuple[bool, bool], tuple[int, ...] | None]:
    """((embedding, loss) accounted, the stages) of the first of both, the loss alone
    (its stage also runs the logits) and the embedding alone that Megatron accepts for
    ``num_layers``; (NOT_ACCOUNTED, None) where none does."""
    for embedding, loss in (BOTH_ACCOUNTED, (False, True), (True, False)):
        try:
            return (embedding, loss), StageLayout.resolve(
                num_layers, pp, chunks, account_embedding=embedding,
                account_loss=loss).counts()
        except ValueError:
            continue
    return NOT_ACCOUNTED, None


def lighter_ends(num_layers: int, pp: int, chunks: int) -> tuple[int, int] | None:
    """The (--decoder-first-pipeline-num-layers, --decoder-last-pipeline-num-layers) that
    split ``num_layers`` over ``pp > 2`` ranks of ``chunks`` chunks as Megatron requires
    (each end a multiple of ``chunks``, the middle layers of the middle stages x
    ``chunks``), neither end heavier than a middle stage, the ends as heavy as that
    allows (the last end no heavier than the first: it also runs the output layer);
    None where none does."""
    if pp <= 2:
        return None
    best = None
    for first in range(chunks, num_layers, chunks):
        for last in range(chunks, first + 1, chunks):
            middle = num_layers - first - last
            if middle <= 0 or middle % ((pp - 2) * chunks) or first > middle // (pp - 2):
                continue
            if best is None or (first + last, last) > (sum(best), best[1]):
                best = (first, last)
    return best


def primary_layouts(name: str, num_layers: int,
                    pp: int) -> list[tuple[int, tuple[int, int] | None, tuple[bool, bool]]]:
    """The layout of :func:`chunk_layouts` the first ranking prices: the family's default
    count's first where it splits the layers, else the smallest count's first (none:
    empty); :func:`try_chunks` prices the others for the fastest candidates."""
    layouts = chunk_layouts(name, num_layers, pp)
    default = [layout for layout in layouts if layout[0] == family(name).default_chunks]
    return (default or layouts)[:1]


def try_chunks(config: PlanConfig, ranked: list, predict: Callable,
               is_default: Callable[[Candidate], bool]) -> list:
    """``ranked`` predictions (best first) with the other chunk counts
    (:func:`chunk_layouts`) of the :data:`TRIED` fastest fitting candidates of a family
    that takes any count, and of the fastest fitting one ``is_default`` (row M) marks,
    added (``predict``: candidate -> prediction, a ValueError where it cannot run). The
    search stays bounded: at most ``TRIED + 1`` candidates times the counts."""
    def open_ended(pred) -> bool:
        return family(pred.candidate.schedule).max_chunks is None
    chosen = [p for p in ranked if p.fits and open_ended(p)][:TRIED]
    default = next((p for p in ranked if p.fits and is_default(p.candidate) and
                    open_ended(p)), None)
    if default is not None and default not in chosen:
        chosen.append(default)
    added = []
    for pred in chosen:
        cand = pred.candidate
        for chunks, ends, accounted in chunk_layouts(cand.schedule, config.model.num_layers,
                                                     cand.pp):
            if (chunks, ends, accounted) == (cand.num_chunks, cand.uneven, cand.accounted):
                continue
            try:
                new = predict(replace(cand, chunks=chunks, uneven=ends, accounted=accounted,
                                      recompute=False))
            except ValueError:
                continue
            new.megatron_default = is_default(new.candidate)
            added.append(new)
    return ranked + added


def _tried(name: str, num_layers: int, pp: int) -> list[int]:
    fam = family(name)
    if fam.max_chunks is not None and fam.max_chunks <= 2:
        return [fam.default_chunks]
    low = fam.min_chunks
    top = max(low, min(MAX_CHUNKS, (num_layers + 2) // pp))  # + 2: the accounted layers
    return [v for v in range(low, top + 1) if fam.accepts_chunks(v)]


def _splits(num_layers: int, pp: int, chunks: int, uneven: tuple[int, int] | None) -> bool:
    if uneven is None:
        return num_layers % (pp * chunks) == 0
    try:
        StageLayout.resolve(num_layers, pp, chunks, first=uneven[0], last=uneven[1])
    except ValueError:
        return False
    return True


def offload_sets(num_chunks: int) -> list[tuple[int, ...]]:
    """The ``--offload-chunks`` sets tried at ``num_chunks`` chunks per rank: every
    non-empty subset up to :data:`ALL_SUBSETS_UP_TO` chunks, beyond it the first ``k``
    and the last ``k`` chunks for each ``k`` (all chunks once)."""
    if num_chunks < 1:
        raise ValueError(f"--num-model-chunks must be >= 1, got {num_chunks}")
    if num_chunks <= ALL_SUBSETS_UP_TO:
        return [c for size in range(1, num_chunks + 1)
                for c in itertools.combinations(range(num_chunks), size)]
    out = []
    for k in range(1, num_chunks + 1):
        for chunks in (tuple(range(k)), tuple(range(num_chunks - k, num_chunks))):
            if chunks not in out:
                out.append(chunks)
    return out
