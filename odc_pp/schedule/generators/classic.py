"""Hand-built orders: 1F1B, Megatron interleaved (VPP), ZB-H1, ZB-V and DualPipeV.

These families are fixed patterns (they do not depend on the cost model); memory is a
property of the pattern and is checked by the caller against any limit.
"""

from __future__ import annotations

from typing import Iterator

from ..ir import Action, ActionKind, Placement, Schedule

__all__ = ["one_f_one_b", "interleaved", "zb_h1", "zb_h2", "zbv_handcrafted",
           "zbv_handcrafted_fits", "zbv_rank_plan", "dualpipev",
           "interleaved_order", "microbatch_groups"]


class _RankWriter:
    """Appends actions of one rank, numbering microbatches per (kind, chunk)."""

    def __init__(self, schedule: Schedule, rank: int) -> None:
        self.schedule, self.rank = schedule, rank
        self.count: dict[tuple[ActionKind, int], int] = {}
        self.w_queue: list[tuple[int, int]] = []

    def next_mb(self, kind: ActionKind, chunk: int) -> int:
        backward = ActionKind.B if kind is ActionKind.BW else kind
        return self.count.get((backward, chunk), 0)

    def add(self, kind: ActionKind, chunk: int = 0, *, overlap_next: bool = False) -> None:
        """Append the next microbatch of (kind, chunk); ``overlap_next`` records that this
        action and the following one form an overlapped pair (DualPipe)."""
        if overlap_next:
            self.schedule.meta.setdefault("overlap_pairs", []).append(
                [self.rank, len(self.schedule.ranks[self.rank])])
        key = (ActionKind.B if kind is ActionKind.BW else kind, chunk)
        mb = self.count.get(key, 0)
        self.count[key] = mb + 1
        if kind is ActionKind.B:
            self.w_queue.append((chunk, mb))
        self.schedule.append(Action(rank=self.rank, kind=kind, chunk=chunk, microbatch=mb))

    def add_w(self) -> None:
        """The oldest pending weight-gradient pass, if any."""
        if self.w_queue:
            chunk, mb = self.w_queue.pop(0)
            self.schedule.append(Action(rank=self.rank, kind=ActionKind.W, chunk=chunk,
                                        microbatch=mb))


def one_f_one_b(pp: int, num_microbatches: int) -> Schedule:
    """Classic 1F1B with fused backward: rank r warms up with ``pp - r - 1`` forwards."""
    schedule = Schedule(name="1f1b", pp=pp, num_microbatches=num_microbatches)
    for rank in range(pp):
        writer = _RankWriter(schedule, rank)
        warmup = min(pp - rank - 1, num_microbatches)
        for _ in range(warmup):
            writer.add(ActionKind.F)
        for _ in range(num_microbatches - warmup):
            writer.add(ActionKind.F)
            writer.add(ActionKind.BW)
        for _ in range(warmup):
            writer.add(ActionKind.BW)
    return schedule


def microbatch_groups(num_microbatches: int, group_size: int) -> list[range]:
    """Consecutive groups of ``group_size`` microbatches; a remainder joins the last
    group (a short last group would make the warm-up deadlock)."""
    count = max(num_microbatches // group_size, 1)
    bounds = [i * group_size for i in range(count)] + [num_microbatches]
    return [range(lo, hi) for lo, hi in zip(bounds, bounds[1:])]


def interleaved_order(num_microbatches: int, num_chunks: int, group_size: int,
                      *, backward: bool) -> list[tuple[int, int]]:
    """(chunk, microbatch) visit order of Megatron's VPP: each microbatch group runs
    through every chunk (chunks reversed for the backward)."""
    chunks = list(range(num_chunks))
    if backward:
        chunks.reverse()
    return [(chunk, mb) for group in microbatch_groups(num_microbatches, group_size)
            for chunk in chunks for mb in group]


def interleaved(pp: int, num_microbatches: int, num_chunks: int, *,
                group_size: int | None = None, name: str = "interleaved") -> Schedule:
    """Megatron interleaved 1F1B: warmup ``2 (pp - r - 1) + (v - 1) * G`` forwards
    (``G`` the largest microbatch group), then one forward / one fused backward, then
    the remaining backwards."""
    group_size = pp if group_size is None else group_size
    if group_size < pp:
        raise ValueError(f"group_size must be >= pp ({pp}) so a group fills the pipeline, "
                         f"got {group_size} (the gis schedule takes 1..pp)")
    schedule = Schedule(name=name, pp=pp, num_microbatches=num_microbatches,
                        num_chunks=num_chunks, placement=Placement.INTERLEAVED)
    forward = interleaved_order(num_microbatches, num_chunks, group_size, backward=False)
    backward = interleaved_order(num_microbatches, num_chunks, group_size, backward=True)
    largest = max(len(g) for g in microbatch_groups(num_microbatches, group_size))
    total = len(forward)
    for rank in range(pp):
        warmup = min(2 * (pp - rank - 1) + (num_chunks - 1) * largest, total)
        actions = [(ActionKind.F, item) for item in forward[:warmup]]
        for step in range(total - warmup):
            actions.append((ActionKind.F, forward[warmup + step]))
            actions.append((ActionKind.BW, backward[step]))
        actions.extend((ActionKind.BW, item) for item in backward[total - warmup:])
        schedule.extend(Action(rank=rank, kind=kind, chunk=chunk, microbatch=mb)
                        for kind, (chunk, mb) in actions)
    return schedule


def zb_h1(pp: int, num_microbatches: int) -> Schedule:
    """ZB-H1: 1F1B's forward/backward order with B and W split; each rank keeps at most
    ``pp`` microbatches alive (1F1B's peak), runs a W only when a forward would exceed
    that, and uses the leftover W passes to fill the cool-down bubbles."""
    schedule = Schedule(name="zb-h1", pp=pp, num_microbatches=num_microbatches)
    for rank in range(pp):
        writer = _RankWriter(schedule, rank)

        def forward() -> None:
            while writer.next_mb(ActionKind.F, 0) - writer.next_mb(ActionKind.W, 0) >= pp:
                writer.add(ActionKind.W)
            writer.add(ActionKind.F)

        warmup = min(pp - rank - 1, num_microbatches)
        for _ in range(warmup):
            forward()
        for _ in range(num_microbatches):
            if writer.next_mb(ActionKind.F, 0) < num_microbatches:
                forward()
            writer.add(ActionKind.B)
            done_f = writer.next_mb(ActionKind.F, 0) >= num_microbatches
            if done_f and writer.next_mb(ActionKind.B, 0) < num_microbatches:
                writer.add(ActionKind.W)  # cool-down: W fills the wait for the next B
        while writer.next_mb(ActionKind.W, 0) < num_microbatches:
            writer.add(ActionKind.W)
    return schedule


def zb_h2(pp: int, num_microbatches: int, inflight: int | None = None) -> Schedule:
    """ZB-H2, the zero-bubble paper's handcrafted order (its Figure 3, bottom).

    Rank r warms up with ``2 (pp - r) - 1`` forwards, so the extra forwards fill the wait
    for its first B; then, for every B, it runs the B followed by the next forward (a W
    first when ``inflight`` microbatches are between their F and their W), and once the
    forwards are done, one W after each B; the remaining W passes close the rank. At most
    ``inflight`` (default ``2 pp - 1``) microbatches are held between F and W on any rank.
    At equal F/B/W times and no transfer latency every rank runs without idle time from
    its first to its last action when ``num_microbatches >= 2 pp``; in general the bubble
    is ``(pp - 1) (T_F + T_B + 2 T_comm - 2 T_W)`` when that is positive (the paper's
    closed form). A lower ``inflight`` (a memory limit) also shortens rank r's warm-up to
    ``inflight - r`` forwards (at ``inflight = pp`` this is ZB-H1's bubble).
    """
    limit = 2 * pp - 1 if inflight is None else inflight
    if limit < 1:
        raise ValueError(f"zb-h2 needs inflight >= 1, got {inflight}")
    schedule = Schedule(name="zb-h2", pp=pp, num_microbatches=num_microbatches)
    F, B, W = ActionKind.F, ActionKind.B, ActionKind.W
    for rank in range(pp):
        writer = _RankWriter(schedule, rank)
        for _ in range(min(num_microbatches, 2 * (pp - rank) - 1, max(1, limit - rank))):
            writer.add(F)
        for _ in range(num_microbatches):
            writer.add(B)
            if writer.next_mb(F, 0) < num_microbatches:
                if writer.next_mb(F, 0) - writer.next_mb(W, 0) >= limit:
                    writer.add_w()
                writer.add(F)
            else:
                writer.add_w()
        while writer.w_queue:
            writer.add_w()
    return schedule


def zbv_rank_plan(pp: int, num_microbatches: int, rank: int) -> Iterator[tuple]:
    """The (kind, chunk) sequence of rank ``rank`` in the handcrafted ZB-V order (each
    kind/chunk pair takes its microbatches in order; see ``zbv_handcrafted``)."""
    F, B, W = ActionKind.F, ActionKind.B, ActionKind.W
    count = {(kind, chunk): 0 for kind in (F, B, W) for chunk in (0, 1)}
    m = num_microbatches

    def step(kind: ActionKind, chunk: int) -> tuple:
        count[(kind, chunk)] += 1
        return kind, chunk
    seq = [(F, 0)] * (2 * (pp - rank) - 1) + [(F, 1), (F, 0)] * rank
    seq += [(F, 1), (B, 1), (W, 1)] * (pp - rank)
    for kind, chunk in seq:
        yield step(kind, chunk)
    while count[(F, 1)] < count[(F, 0)] or count[(F, 0)] < m:
        if count[(F, 0)] < m:
            yield step(F, 0)
        for kind, chunk in [(B, 0), (W, 0), (F, 1), (B, 1), (W, 1)]:
            yield step(kind, chunk)
    for _ in range(rank):
        yield step(B, 0)
        yield step(B, 1)
    for _ in range(pp - rank):
        yield step(B, 0)
        yield step(W, 0)
    for chunk in (1, 0):
        while count[(W, chunk)] < m:
            yield step(W, chunk)


def zbv_handcrafted_fits(pp: int, num_microbatches: int, memory_delta, cap: float) -> bool:
    """Whether every rank's running sum of ``memory_delta(kind)`` over the handcrafted
    ZB-V order stays within ``cap`` (stops at the first excess; no orders built)."""
    for rank in range(pp):
        memory = 0.0
        for kind, _ in zbv_rank_plan(pp, num_microbatches, rank):
            memory += memory_delta(kind)
            if memory > cap:
                return False
    return True


def zbv_handcrafted(pp: int, num_microbatches: int) -> Schedule:
    """ZB-V (needs ``num_microbatches >= 2 pp - 1``): rank r runs ``2 (pp - r) - 1``
    chunk-0 forwards, ``r`` (F1, F0) pairs, ``pp - r`` (F1, B1, W1) triples, then the
    steady (F0, B0, W0, F1, B1, W1) pattern; the cool-down runs the remaining backwards
    first and defers W passes to the end (``zbv_rank_plan``)."""
    if num_microbatches < 2 * pp - 1:
        raise ValueError(f"handcrafted ZB-V needs num_microbatches >= 2*pp-1 = {2 * pp - 1}")
    schedule = Schedule(name="zbv", pp=pp, num_microbatches=num_microbatches, num_chunks=2,
                        placement=Placement.V)
    for rank in range(pp):
        writer = _RankWriter(schedule, rank)
        for kind, chunk in zbv_rank_plan(pp, num_microbatches, rank):
            writer.add(kind, chunk)
    return schedule


def dualpipev(pp: int, num_microbatches: int) -> Schedule:
    """DeepSeek's DualPipeV (needs ``num_microbatches >= 2 pp``), V placement.

    Per rank r: ``2 (pp - r - 1)`` F0; ``r + 1`` (F0, F1); ``pp - r - 1`` (B1, W, F1);
    the main phase of overlapped pairs (F0 with BW1, then F1 with BW0), emitted as
    adjacent actions and listed in ``meta["overlap_pairs"]`` as [rank, index of the F]; ``pp - r - 1`` (BW1, F1 with BW0); ``r + 1`` (B1, B0) whose second
    half splits off W; ``pp - r - 1`` (W, B0); the remaining W passes.
    """
    if num_microbatches < 2 * pp:
        raise ValueError(f"dualpipev needs num_microbatches >= 2*pp = {2 * pp}")
    schedule = Schedule(name="dualpipev", pp=pp, num_microbatches=num_microbatches,
                        num_chunks=2, placement=Placement.V)
    F, B, BW = ActionKind.F, ActionKind.B, ActionKind.BW
    for rank in range(pp):
        writer = _RankWriter(schedule, rank)
        for _ in range(2 * (pp - rank - 1)):
            writer.add(F, 0)
        for _ in range(rank + 1):
            writer.add(F, 0)
            writer.add(F, 1)
        for _ in range(pp - rank - 1):
            writer.add(B, 1)
            writer.add_w()
            writer.add(F, 1)
        for step in range(num_microbatches - 2 * pp + rank + 1):
            # the last rank's first pair is not overlapped: it shortens its bubble
            overlapped = not (step == 0 and rank == pp - 1)
            writer.add(F, 0, overlap_next=overlapped)
            writer.add(BW, 1)
            writer.add(F, 1, overlap_next=True)
            writer.add(BW, 0)
        for _ in range(pp - rank - 1):
            writer.add(BW, 1)
            writer.add(F, 1, overlap_next=True)
            writer.add(BW, 0)
        split = False
        for step in range(rank + 1):
            if step == (rank + 1) // 2 and rank % 2 == 1:
                split = True
            writer.add(B if split else BW, 1)
            if step == (rank + 1) // 2 and rank % 2 == 0:
                split = True
            writer.add(B if split else BW, 0)
        for _ in range(pp - rank - 1):
            writer.add_w()
            writer.add(B if split else BW, 0)
        while writer.w_queue:
            writer.add_w()
    return schedule
