"""PipeOffload: group-interleaved 1F1B whose long-lived activations go to host memory.

The compute order is Megatron's interleaved 1F1B when no ``group_size`` is given (or one
above ``pp``), else PipeOffload's group-interleaved order (``group_interleaved``:
``ceil(pp / 2) <= g <= pp`` its GIS, ``g = 1`` its uniform repeating order). Which chunks to offload is decided from the simulated
timing of that order: a chunk qualifies when every one of its activations lives (F end to
backward start) at least ``2 / offload_bandwidth`` -- long enough for the offload and the
reload to both run hidden in the gap. Qualifying chunks are taken longest-lived first
while the rank's host link (one offload and one reload per microbatch per chunk) stays
within the rank's compute time. With a ``memory_limit``, the fewest chunks whose lowered
peak fits are taken, and every chunk may be used if needed (some transfers then show).
The OFFLOAD/RELOAD actions themselves come from ``lowering.insert_offload``.
"""

from __future__ import annotations

from ..costs import CostModel
from ..ir import ActionKind, Schedule
from ..lowering import insert_offload
from ..simulator import simulate
from ..validate import peak_memory
from .classic import interleaved
from .group_interleaved import group_interleaved

__all__ = ["offload_schedule"]


def _lifespans(schedule: Schedule, costs: CostModel) -> tuple[dict[int, float], list[float]]:
    """Shortest activation lifespan per chunk, and each rank's compute time."""
    timing = simulate(schedule, costs)
    forward_end: dict[tuple[int, int, int], float] = {}
    shortest: dict[int, float] = {}
    for rank, actions in enumerate(schedule.ranks):
        for action in actions:
            item = (rank, action.chunk, action.microbatch)
            if action.kind is ActionKind.F:
                forward_end[item] = timing.end[action]
            elif action.kind in (ActionKind.B, ActionKind.BW):
                life = timing.start[action] - forward_end[item]
                shortest[action.chunk] = min(shortest.get(action.chunk, life), life)
    return shortest, timing.busy


def offload_schedule(pp: int, num_microbatches: int, num_chunks: int, costs: CostModel,
                     memory_limit: float | None, group_size: int | None = None) -> Schedule:
    if costs.offload_bandwidth is None:
        raise ValueError("the offload schedule needs the host-link bandwidth: give "
                         "--offload-bandwidth (microbatch-chunk activations per time unit; "
                         "\"offload_bandwidth\" in a --cost-model file)")
    if group_size is not None and group_size <= pp:
        schedule = group_interleaved(pp, num_microbatches, num_chunks,
                                     group_size=group_size, name="offload")
    else:
        schedule = interleaved(pp, num_microbatches, num_chunks, group_size=group_size,
                               name="offload")
    transfer = costs.offload_time
    shortest, busy = _lifespans(schedule, costs)
    by_life = sorted(range(num_chunks), key=lambda c: (-shortest[c], c))
    link_budget = min(busy)
    hidden: list[int] = []
    for chunk in by_life:
        link_time = 2 * transfer * num_microbatches * (len(hidden) + 1)
        if shortest[chunk] >= 2 * transfer and link_time <= link_budget + 1e-9:
            hidden.append(chunk)
    chosen = sorted(hidden)
    if memory_limit is not None:
        chosen = None
        for count in range(num_chunks + 1):
            pick = (hidden + [c for c in by_life if c not in hidden])[:count]
            lowered = insert_offload(schedule, costs, pick)
            if max(peak_memory(lowered, costs)) <= memory_limit + 1e-9:
                chosen = sorted(pick)
                break
        if chosen is None:
            best = max(peak_memory(insert_offload(schedule, costs, list(range(num_chunks))),
                               costs))
            raise ValueError(f"memory_limit {memory_limit:g} is below {best:g}, the peak "
                             f"with every chunk offloaded; raise memory_limit, add "
                             f"microbatch groups (smaller group_size) or use v-min")
    schedule.meta.update({
        "offload_chunks": chosen,
        "offload_time": transfer,
        "hidden_offload_chunks": sorted(hidden),
        "min_lifespan": {str(c): shortest[c] for c in range(num_chunks)},
        "memory_limit": memory_limit,
        "group_size": pp if group_size is None else group_size,
    })
    return schedule
