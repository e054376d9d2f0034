"""What the schedule checks share (:mod:`odc_pp.schedule.validate` and
:mod:`odc_pp.schedule.nccl_order`): the error they raise, how they name an action, and
which message a SEND/RECV carries between which ranks."""

from __future__ import annotations

from .ir import Action, ActionKind, Schedule

__all__ = ["ScheduleError", "where", "message_route"]


class ScheduleError(ValueError):
    """A schedule breaks a rule; the message names the offending action."""


def where(rank: int, position: int, action: Action) -> str:
    """``rank R position P (F0.3)``: how every check names an action."""
    return f"rank {rank} position {position} ({action.short()})"


def message_route(schedule: Schedule, action: Action):
    """For a SEND/RECV action: (message id, src rank, dst rank, consumer local chunk),
    or None when the action's stage has no neighbour in that direction."""
    stage = schedule.stage_of(action.rank, action.chunk)
    mb = action.microbatch
    if action.kind is ActionKind.SEND_F:
        if stage == schedule.num_stages - 1:
            return None
        dst, chunk = schedule.locate(stage + 1)
        return ("F", stage, mb), action.rank, dst, chunk
    if action.kind is ActionKind.SEND_B:
        if stage == 0:
            return None
        dst, chunk = schedule.locate(stage - 1)
        return ("B", stage, mb), action.rank, dst, chunk
    if action.kind is ActionKind.RECV_F:
        if stage == 0:
            return None
        src, _ = schedule.locate(stage - 1)
        return ("F", stage - 1, mb), src, action.rank, action.chunk
    if stage == schedule.num_stages - 1:  # RECV_B
        return None
    src, _ = schedule.locate(stage + 1)
    return ("B", stage + 1, mb), src, action.rank, action.chunk
