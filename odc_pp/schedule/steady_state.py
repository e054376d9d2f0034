"""The steady state of consecutive iterations (issue 31): under optimizer post-validation
no rank waits for the others between iterations. Each rank takes its optimizer step at
its own POST_VALIDATION, and the step's global check completes during the next minibatch
(``docs/design.md``). So rank r starts iteration i + 1 as soon as its own actions of
iteration i are done. The makespan of one iteration over-states that period (the
pipeline's fill and drain of successive iterations overlap), and the longest per-rank
span (``SimResult.max_stage_span``) under-states it (it assumes the overlap is perfect).

:func:`steady_period` simulates ``k`` copies of a schedule back to back on every rank
(:func:`repeat`: the copies' microbatches renumbered, so each copy keeps its own
dependencies). The period is then ``(T_k - T_1) / (k - 1)``, where ``T_k`` is the
makespan of ``k`` copies: the time one more iteration adds once the pipeline runs
continuously. Runs that synchronise before the optimizer step (no post-validation) repeat
at their makespan.
"""

from __future__ import annotations

import dataclasses

from .costs import CostModel
from .ir import ActionKind, Schedule
from .simulator import simulate

__all__ = ["repeat", "steady_period"]


def repeat(schedule: Schedule, iterations: int) -> Schedule:
    """``iterations`` copies of ``schedule`` run back to back on every rank; copy ``i``'s
    microbatch ``j`` is microbatch ``i * m + j`` (POST_VALIDATION markers stay -1)."""
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    m = schedule.num_microbatches
    ranks = []
    for actions in schedule.ranks:
        ranks.append([
            action if action.kind is ActionKind.POST_VALIDATION else
            dataclasses.replace(action, microbatch=copy * m + action.microbatch)
            for copy in range(iterations) for action in actions])
    return Schedule(name=f"{schedule.name}x{iterations}", pp=schedule.pp,
                    num_microbatches=m * iterations, num_chunks=schedule.num_chunks,
                    placement=schedule.placement, ranks=ranks, meta=dict(schedule.meta))


def steady_period(schedule: Schedule, costs: CostModel, *, iterations: int = 4,
                  single: float | None = None) -> float:
    """The time between the starts of consecutive iterations once they overlap
    (post-validation), from ``iterations`` (>= 2) copies simulated back to back (each copy
    with the same per-microbatch costs; ``single``: one copy's makespan, when the caller
    has simulated it already)."""
    if iterations < 2:
        raise ValueError(f"iterations must be >= 2, got {iterations}")
    one = simulate(schedule, costs).makespan if single is None else single
    if costs.microbatch_scale is not None:
        costs = dataclasses.replace(
            costs, microbatch_scale=tuple(costs.microbatch_scale) * iterations)
    many = simulate(repeat(schedule, iterations), costs).makespan
    return (many - one) / (iterations - 1)
