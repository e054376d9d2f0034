"""Hand-built compute-only schedules (independent of odc_pp.schedule.generators)."""

from __future__ import annotations

from odc_pp.schedule.ir import Action, ActionKind, Placement, Schedule


def one_f_one_b(pp: int, num_microbatches: int, *, split: bool = False) -> Schedule:
    """Classic 1F1B; ``split``: B then W right after it (ZB-H1-like order)."""
    schedule = Schedule(name="hand-1f1b", pp=pp, num_microbatches=num_microbatches)
    for rank in range(pp):
        warmup = min(pp - rank - 1, num_microbatches)
        order = [("F", m) for m in range(warmup)]
        forward, backward = warmup, 0
        while backward < num_microbatches:
            if forward < num_microbatches:
                order.append(("F", forward))
                forward += 1
            order.append(("B", backward))
            backward += 1
        for kind, mb in order:
            if kind == "F":
                schedule.append(Action(rank=rank, kind=ActionKind.F, microbatch=mb))
            elif split:
                schedule.append(Action(rank=rank, kind=ActionKind.B, microbatch=mb))
                schedule.append(Action(rank=rank, kind=ActionKind.W, microbatch=mb))
            else:
                schedule.append(Action(rank=rank, kind=ActionKind.BW, microbatch=mb))
    return schedule


def gpipe_v(pp: int, num_microbatches: int) -> Schedule:
    """All forwards in stage order, then B in reverse stage order, W at the end (V)."""
    schedule = Schedule(name="hand-v", pp=pp, num_microbatches=num_microbatches,
                        num_chunks=2, placement=Placement.V)
    for rank in range(pp):
        for chunk in (0, 1):
            for mb in range(num_microbatches):
                schedule.append(Action(rank=rank, kind=ActionKind.F, chunk=chunk, microbatch=mb))
        for chunk in (1, 0):
            for mb in range(num_microbatches):
                schedule.append(Action(rank=rank, kind=ActionKind.B, chunk=chunk, microbatch=mb))
        for chunk in (1, 0):
            for mb in range(num_microbatches):
                schedule.append(Action(rank=rank, kind=ActionKind.W, chunk=chunk, microbatch=mb))
    return schedule
