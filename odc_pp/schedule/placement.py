"""Where model chunks live: free functions mapping (rank, chunk) <-> virtual stage.

Virtual stages are numbered ``0 .. pp * num_chunks - 1`` in model order; a rank holds
``num_chunks`` model chunks and ``placement`` decides which stages:

* ``interleaved`` (Megatron VPP): stage = chunk * pp + rank.
* ``v`` (zig-zag, ZB-V / V-Half / V-Min / DualPipeV): even chunks run down the ranks
  (stage = chunk * pp + rank), odd chunks run back up
  (stage = chunk * pp + pp - 1 - rank). With 2 chunks, rank 0 holds the first and the
  last stage.

This module is the one owner of that arithmetic: the IR, the generators, the tuner, the
model builder and the training frontend all call these functions.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["Placement", "stage_of", "locate", "num_stages", "rank_stages",
           "last_stage_rank"]


class Placement(str, Enum):
    INTERLEAVED = "interleaved"
    V = "v"


def num_stages(pp: int, num_chunks: int) -> int:
    """Virtual stages of a pipeline of ``pp`` ranks with ``num_chunks`` chunks each."""
    return pp * num_chunks


def stage_of(placement: Placement | str, pp: int, rank: int, chunk: int) -> int:
    """Virtual stage that local ``chunk`` of ``rank`` runs."""
    if Placement(placement) is Placement.V and chunk % 2 == 1:
        return chunk * pp + pp - 1 - rank
    return chunk * pp + rank


def locate(placement: Placement | str, pp: int, num_chunks: int, stage: int) -> tuple[int, int]:
    """(rank, chunk) that runs virtual ``stage``; ValueError outside the pipeline."""
    total = num_stages(pp, num_chunks)
    if not 0 <= stage < total:
        raise ValueError(f"stage {stage} outside 0..{total - 1}")
    chunk, offset = divmod(stage, pp)
    if Placement(placement) is Placement.V and chunk % 2 == 1:
        return pp - 1 - offset, chunk
    return offset, chunk


def rank_stages(placement: Placement | str, pp: int, num_chunks: int, rank: int) -> list[int]:
    """Virtual stages of ``rank``'s chunks, in local chunk order."""
    return [stage_of(placement, pp, rank, chunk) for chunk in range(num_chunks)]


def last_stage_rank(placement: Placement | str, pp: int, num_chunks: int) -> int:
    """The rank that runs the last virtual stage (computes the loss)."""
    return locate(placement, pp, num_chunks, num_stages(pp, num_chunks) - 1)[0]
