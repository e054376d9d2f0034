"""Group-interleaved 1F1B (PipeOffload's GIS) and its uniform repeating order (PO).

PipeOffload (arXiv 2503.01328) generalises Megatron's interleaved 1F1B: a rank runs
microbatches through a model chunk ``group_size`` at a time (Megatron-LM's
``--microbatch-group-size-per-virtual-pipeline-stage``), but the group no longer has to
fill the pipeline; any ``ceil(pp / 2) <= g <= pp`` keeps the steady state free of
dependency bubbles at equal forward/backward cost, and a smaller group holds fewer
microbatches in flight. With ``g = 1`` the order is the paper's uniform repeating order:
every microbatch enters chunk ``c + 1`` a fixed lag after chunk ``c``, so each chunk's
activations have the same lifespan at every step and the memory held is flat in time.

The order is a repeating building block. Forward ``(c, i)`` sits at position
``lag * c + (i mod g) + g * v * (i // g)`` (plus one group per ``v / gcd(v, lag / g)``
chunks, so two chunks never share a position), ``lag`` being the smallest multiple of
``g`` that is at least ``ceil(pp / 2)``; backward ``(c, i)`` takes the position of
forward ``(v - 1 - c, i)``. Rank ``r`` warms up with the forwards up to and including the
last chunk's first microbatch plus ``pp - r - 1`` more (one per hop to the last rank and
back, since a forward and a fused backward alternate in the steady state), then alternates
one forward and one backward, then runs the remaining backwards.
"""

from __future__ import annotations

import math

from ..ir import Action, ActionKind, Placement, Schedule

__all__ = ["chunk_lag", "group_interleaved_order", "group_interleaved", "min_group_size"]


def min_group_size(pp: int) -> int:
    """The paper's smallest group size that still fills the pipeline: ``ceil(pp / 2)``."""
    return (pp + 1) // 2


def chunk_lag(pp: int, group_size: int) -> int:
    """Microbatches between a microbatch's forward on chunk ``c`` and on ``c + 1`` in the
    building block: the smallest multiple of ``group_size`` >= ``ceil(pp / 2)``."""
    return group_size * -(-min_group_size(pp) // group_size)


def _positions(num_microbatches: int, num_chunks: int, pp: int, group_size: int
               ) -> dict[tuple[int, int], int]:
    """Building-block position of forward (chunk, microbatch) (see the module doc)."""
    g, v = group_size, num_chunks
    lag = chunk_lag(pp, g)
    stride = v // math.gcd(v, lag // g)
    return {(c, i): lag * c + i % g + g * v * (i // g) + g * (c // stride)
            for c in range(v) for i in range(num_microbatches)}


def group_interleaved_order(num_microbatches: int, num_chunks: int, pp: int,
                            group_size: int, rank: int) -> list[tuple[str, int, int]]:
    """Rank ``rank``'s ("F" or "BW", chunk, microbatch) order: forward (c, i) at time
    ``3 P(c, i)``, its backward at ``3 P(v - 1 - c, i) + 3 P(v - 1, 0) + 3 (pp - 1 - rank)
    + 1`` (``P`` the block position; a forward and a backward each cycle of three slots:
    one hop forward takes one slot, one hop back two)."""
    v = num_chunks
    pos = _positions(num_microbatches, num_chunks, pp, group_size)
    lead = 3 * pos[(v - 1, 0)] + 3 * (pp - 1 - rank) + 1
    timed = [(3 * p, "F", c, i) for (c, i), p in pos.items()]
    timed += [(3 * pos[(v - 1 - c, i)] + lead, "BW", c, i) for (c, i) in pos]
    return [(kind, c, i) for _, kind, c, i in sorted(timed)]


def group_interleaved(pp: int, num_microbatches: int, num_chunks: int, *,
                      group_size: int | None = None, name: str = "gis") -> Schedule:
    """Group-interleaved 1F1B with fused backwards (module doc); ``group_size`` defaults to
    ``ceil(pp / 2)``, must be in ``1..pp`` (1: the uniform repeating order)."""
    group_size = min_group_size(pp) if group_size is None else group_size
    if not 1 <= group_size <= pp:
        raise ValueError(f"group_size must be in 1..pp ({pp}) for the group-interleaved "
                         f"order (ceil(pp/2) = {min_group_size(pp)} .. pp is PipeOffload's "
                         f"GIS, 1 its uniform repeating order), got {group_size}; a group "
                         f"of pp or more is Megatron's order (--pipeline-schedule "
                         f"interleaved)")
    schedule = Schedule(name=name, pp=pp, num_microbatches=num_microbatches,
                        num_chunks=num_chunks, placement=Placement.INTERLEAVED,
                        meta={"group_size": group_size})
    for rank in range(pp):
        order = group_interleaved_order(num_microbatches, num_chunks, pp, group_size, rank)
        for kind, chunk, mb in order:
            kinds = (ActionKind.F,) if kind == "F" else (ActionKind.B, ActionKind.W)
            schedule.extend(Action(rank=rank, kind=k, chunk=chunk, microbatch=mb)
                            for k in kinds)
    return schedule
