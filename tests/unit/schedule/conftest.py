"""Hand-built schedules for the simulator/search/render tests (independent of generators)."""

from __future__ import annotations

import pytest

from odc_pp.schedule import Action, ActionKind, Schedule


def build_1f1b(pp: int, num_microbatches: int, *, split_w: bool = False) -> Schedule:
    """Classic 1F1B: rank r warms up with pp-r-1 forwards, then alternates F and backward.

    With ``split_w`` each fused BW becomes B immediately followed by W.
    """
    schedule = Schedule(name="1f1b-hand", pp=pp, num_microbatches=num_microbatches)
    for rank in range(pp):
        warmup = min(pp - rank - 1, num_microbatches)
        order: list[tuple[ActionKind, int]] = [(ActionKind.F, i) for i in range(warmup)]
        next_f, next_b = warmup, 0
        while next_b < num_microbatches:
            if next_f < num_microbatches:
                order.append((ActionKind.F, next_f))
                next_f += 1
            order.append((ActionKind.BW, next_b))
            next_b += 1
        for kind, mb in order:
            if kind is ActionKind.BW and split_w:
                schedule.append(Action(rank=rank, kind=ActionKind.B, microbatch=mb))
                schedule.append(Action(rank=rank, kind=ActionKind.W, microbatch=mb))
            else:
                schedule.append(Action(rank=rank, kind=kind, microbatch=mb))
    return schedule


def lower_by_hand(schedule: Schedule) -> Schedule:
    """Explicit SEND/RECV around every cross-rank dependency (1 chunk, interleaved)."""
    lowered = schedule.copy(ranks=[[] for _ in range(schedule.pp)])
    pp = schedule.pp
    for rank, actions in enumerate(schedule.ranks):
        for action in actions:
            mb = action.microbatch
            if action.kind is ActionKind.F and rank > 0:
                lowered.append(Action(rank=rank, kind=ActionKind.RECV_F, microbatch=mb,
                                      peer=rank - 1))
            if action.kind in (ActionKind.B, ActionKind.BW) and rank < pp - 1:
                lowered.append(Action(rank=rank, kind=ActionKind.RECV_B, microbatch=mb,
                                      peer=rank + 1))
            lowered.append(action)
            if action.kind is ActionKind.F and rank < pp - 1:
                lowered.append(Action(rank=rank, kind=ActionKind.SEND_F, microbatch=mb,
                                      peer=rank + 1))
            if action.kind in (ActionKind.B, ActionKind.BW) and rank > 0:
                lowered.append(Action(rank=rank, kind=ActionKind.SEND_B, microbatch=mb,
                                      peer=rank - 1))
    return lowered


@pytest.fixture
def one_f_one_b():
    return build_1f1b


@pytest.fixture
def lower_hand():
    return lower_by_hand
