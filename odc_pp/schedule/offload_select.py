"""PipeOffload's selective offload: which (chunk, microbatch) passes go to host memory.

An offloaded pass moves its saved activations to the host after its forward and back
before its backward, each transfer taking ``costs.offload_time`` on the rank's host link
(FIFO, overlapping compute). It costs nothing when both transfers hide in the activation's
lifespan (forward end to backward start) and the link is free for them; the passes that
live shorter than the two transfers cannot hide and are not offloaded (PipeOffload,
arXiv 2503.01328, selective offload). Of the passes that can, each rank keeps its
``k`` longest-lived, ``k`` the largest (found by bisection) for which the simulated
makespan stays within the makespan without offload: the hidden-transfer bound, so a busy
link never delays a backward.
"""

from __future__ import annotations

from .costs import CostModel
from .ir import ActionKind, Schedule

__all__ = ["lifespans", "skipped_passes"]

_BACKWARD = (ActionKind.B, ActionKind.BW)
Pass = tuple[int, int, int]
"""(rank, chunk, microbatch)."""


def lifespans(schedule: Schedule, timing, chunks: set[int]) -> dict[Pass, float]:
    """Forward end to backward start of every pass of ``chunks``, under ``timing`` (a
    :class:`~odc_pp.schedule.simulator.SimResult` of ``schedule``)."""
    forward_end: dict[Pass, float] = {}
    life: dict[Pass, float] = {}
    for rank, actions in enumerate(schedule.ranks):
        for action in actions:
            item = (rank, action.chunk, action.microbatch)
            if action.chunk not in chunks:
                continue
            if action.kind is ActionKind.F:
                forward_end[item] = timing.end[action]
            elif action.kind in _BACKWARD:
                life[item] = timing.start[action] - forward_end[item]
    return life


def skipped_passes(schedule: Schedule, costs: CostModel, chunks: set[int], timing,
                   offloaded) -> set[Pass]:
    """The passes of ``chunks`` that stay on the device (module doc). ``timing``: the
    simulation of the compute ``schedule``; ``offloaded(skipped)``: the schedule with the
    OFFLOAD/RELOAD of every other pass of ``chunks`` (``lowering.insert_offload``)."""
    from .simulator import simulate  # lazy: the simulator compiles lowered schedules

    life = lifespans(schedule, timing, chunks)
    lead = 2 * costs.offload_time
    ranked: list[list[Pass]] = [[] for _ in range(schedule.pp)]
    for item, span in sorted(life.items(), key=lambda kv: (-kv[1], kv[0])):
        if span >= lead - 1e-9:
            ranked[item[0]].append(item)
    bound = timing.makespan * (1 + 1e-9) + 1e-9

    def skipped(count: int) -> set[Pass]:
        kept = {item for per_rank in ranked for item in per_rank[:count]}
        return set(life) - kept

    low, high = 0, max(len(per_rank) for per_rank in ranked)
    if high and simulate(offloaded(skipped(high)), costs).makespan <= bound:
        return skipped(high)
    while high - low > 1:  # low always fits (0: nothing offloaded), high never does
        middle = (low + high) // 2
        if simulate(offloaded(skipped(middle)), costs).makespan <= bound:
            low = middle
        else:
            high = middle
    return skipped(low)
