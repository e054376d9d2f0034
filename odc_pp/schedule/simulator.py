"""Event-driven simulator: per-action start/end times, bubbles, memory, overlap.

Every rank executes its action list strictly in order. A compute action starts when
its rank is free and its data dependencies have finished:

* ``F`` of virtual stage ``s`` needs ``F`` of stage ``s-1`` (same microbatch);
* ``B``/``BW`` of stage ``s`` needs ``F`` of stage ``s`` and ``B``/``BW`` of stage ``s+1``;
* ``W`` needs ``B`` of the same stage and microbatch;
* a dependency that crosses ranks costs ``costs.t_comm``.

Communication may be implicit (compute-only schedules) or explicit (lowered
schedules). A dependency uses the explicit path when the consumer's rank holds the
matching ``RECV_F``/``RECV_B``: ``SEND`` is non-blocking and is issued when the rank
reaches it, the ``RECV`` is posted (non-blocking) when the rank reaches it and
completes ``t_comm`` after its ``SEND`` (never before it is posted), and the consumer
compute waits for the ``RECV``. ``OFFLOAD``/``RELOAD`` run in issue order on a
per-rank host-link stream (``1 / offload_bandwidth`` each) that overlaps compute; a
backward whose activations were offloaded waits for the ``RELOAD``. Memory drops by
``mem_f`` when an ``OFFLOAD`` completes and rises by ``mem_f`` when a ``RELOAD`` starts.
``POST_VALIDATION`` is a zero-time marker. With ``costs.t_send_cpu`` /
``costs.t_recv_cpu`` > 0 an explicit SEND / RECV also blocks its rank for that long
(CPU time to issue the message; the transfer still lands ``t_comm`` after the SEND
starts); both default to 0 (free).

Because ranks run in order, times follow from a single pass in dependency order (a
per-rank pointer plus a work stack of unblocked ranks), so a schedule of N actions
is simulated in O(N).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

from .compiled import (_COMPUTE, _KSF, _OFFLOAD, _RECV, _RELOAD, _SEND,
                       CompiledSchedule, DependencyError, compile_schedule)
from .costs import CostModel
from .ir import COMPUTE_KINDS, Action, Schedule

__all__ = ["simulate", "score", "SimResult", "DeadlockError", "DependencyError",
           "OBJECTIVES", "CompiledSchedule", "compile_schedule"]

OBJECTIVES = ("span", "makespan")
"""What a schedule search minimises: ``span`` = the longest per-rank compute span (first
compute start to last compute end on a rank; the steady-state iteration time when
optimizer post-validation lets iterations overlap), ``makespan`` = first start to last
end over all ranks (runs that synchronise before the optimizer step)."""


class DeadlockError(ValueError):
    """No rank can progress; the message lists each rank's blocked action."""


@dataclass
class SimResult:
    """Timing of one simulated schedule (times in the cost model's unit).

    ``start``/``end``/``compute_intervals`` are built on first access (the search
    simulates thousands of schedules and reads only the summary numbers).
    """

    makespan: float
    """First action's start to last action's end over all ranks, transfers included."""
    max_stage_span: float
    """Longest per-rank compute span (``max(span)``): the steady-state iteration time
    when iterations overlap (optimizer post-validation)."""
    bubble_rate: float
    """(C - busy_max) / C, C = longest per-rank compute span, busy_max = compute time of
    the busiest rank (the zero-bubble paper's definition)."""
    per_rank_bubble: list[float]
    """Idle fraction of each rank inside its own compute span."""
    busy: list[float]
    """Compute time of each rank."""
    span: list[float]
    """First compute start to last compute end of each rank."""
    peak_activation: list[float]
    """Peak activation memory per rank, in microbatch-chunk units."""
    memory_timeline: list[list[tuple[float, float]]]
    """Per rank: (time, memory after the change at that time), in time order."""
    memory_limit: float | None = None
    """The limit the result was checked against (None: not checked)."""
    fits_memory: bool = True
    """Whether every rank's peak stays within ``memory_limit``."""
    rank_actions: list[list[Action]] = field(default_factory=list, repr=False)
    """The simulated actions, per rank in execution order."""
    rank_starts: list[list[float]] = field(default_factory=list, repr=False)
    """Start times aligned with ``rank_actions``."""
    rank_ends: list[list[float]] = field(default_factory=list, repr=False)
    """End times aligned with ``rank_actions``."""
    overlaps: tuple[float, float] | Callable[[], tuple[float, float]] = field(
        default=(1.0, 1.0), repr=False)
    """(``comm_overlap``, ``offload_overlap``), or the function that computes them when
    first read."""

    @property
    def makespan_bubble_rate(self) -> float:
        """(makespan - busy_max) / makespan: the busiest rank's idle share of the
        makespan. Unlike :attr:`bubble_rate` (of the longest per-rank span) it orders the
        schedules of one setting as their makespans do: the bubble of a run that
        synchronises before the optimizer step."""
        busiest = max(self.busy, default=0.0)
        return max(0.0, (self.makespan - busiest) / self.makespan) if self.makespan > 0 \
            else 0.0

    @cached_property
    def _overlap_pair(self) -> tuple[float, float]:
        return self.overlaps() if callable(self.overlaps) else self.overlaps

    @property
    def comm_overlap(self) -> float:
        """Fraction of rank-to-rank transfer time during which the receiving rank
        computes (1.0 when there is no transfer time)."""
        return self._overlap_pair[0]

    @property
    def offload_overlap(self) -> float:
        """Fraction of host-link (offload/reload) time during which the rank computes."""
        return self._overlap_pair[1]

    @cached_property
    def start(self) -> dict[Action, float]:
        """Start time of every action (RECV: the time it was posted)."""
        out: dict[Action, float] = {}
        for actions, times in zip(self.rank_actions, self.rank_starts):
            out.update(zip(actions, times))
        return out

    @cached_property
    def end(self) -> dict[Action, float]:
        """End time of every action (SEND/RECV: when the transfer arrives)."""
        out: dict[Action, float] = {}
        for actions, times in zip(self.rank_actions, self.rank_ends):
            out.update(zip(actions, times))
        return out

    @cached_property
    def compute_intervals(self) -> list[list[tuple[float, float, Action]]]:
        """Per rank: (start, end, action) of compute actions in execution order."""
        return [[(s, e, a) for a, s, e in zip(actions, starts, ends) if a.kind in COMPUTE_KINDS]
                for actions, starts, ends in zip(self.rank_actions, self.rank_starts,
                                                 self.rank_ends)]

    def to_dict(self, *, include_actions: bool = False) -> dict:
        out = {
            "makespan": self.makespan, "max_stage_span": self.max_stage_span,
            "bubble_rate": self.bubble_rate, "makespan_bubble_rate": self.makespan_bubble_rate,
            "per_rank_bubble": self.per_rank_bubble, "busy": self.busy, "span": self.span,
            "peak_activation": self.peak_activation, "comm_overlap": self.comm_overlap,
            "offload_overlap": self.offload_overlap, "memory_limit": self.memory_limit,
            "fits_memory": self.fits_memory,
            "memory_timeline": [[list(p) for p in tl] for tl in self.memory_timeline],
        }
        if include_actions:
            rows = [dict(a.to_dict(), start=s, end=e)
                    for actions, starts, ends in zip(self.rank_actions, self.rank_starts,
                                                     self.rank_ends)
                    for a, s, e in zip(actions, starts, ends)]
            rows.sort(key=lambda row: (row["start"], row["rank"]))
            out["actions"] = rows
        return out


def simulate(schedule: Schedule | CompiledSchedule, costs: CostModel, *,
             memory_limit: float | None = None) -> SimResult:
    """Simulate ``schedule`` under ``costs``; see the module docstring for the rules.

    Raises DependencyError for missing, duplicated or misordered dependencies and
    DeadlockError when ranks wait on each other in a cycle.
    """
    if not isinstance(costs, CostModel):
        raise ValueError(f"costs must be a CostModel, got {type(costs).__name__}")
    compiled = _Compiled(schedule, costs)
    starts, ends, end_of = _run(compiled)
    return _summarise(compiled, starts, ends, end_of, memory_limit)


def score(schedule: Schedule | CompiledSchedule, costs: CostModel, *, objective: str = "span",
          memory_limit: float | None = None, cutoff: float = float("inf")) -> float | None:
    """The ``objective`` (see ``OBJECTIVES``) of ``schedule`` under ``costs``, by the
    same rules as :func:`simulate`, or None when a rank's activation memory exceeds
    ``memory_limit`` or the value reaches ``cutoff`` (the run stops as soon as that is
    certain). Searches compare candidates with this; DeadlockError as in ``simulate``."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got "
                         f"{objective!r}")
    if not isinstance(costs, CostModel):
        raise ValueError(f"costs must be a CostModel, got {type(costs).__name__}")
    compiled = _Compiled(schedule, costs)
    if memory_limit is not None and not _fits_in_order(compiled, memory_limit):
        return None
    try:
        starts, ends, _ = _run(compiled, cutoff=cutoff, objective=objective)
    except _CutOff:
        return None
    value = 0.0
    if objective == "makespan":
        if any(starts):
            first = min(min(r) for r in starts if r)
            value = max(max(r) for r in ends if r) - first
    else:
        for ops, rank_starts, rank_ends in zip(compiled.ops, starts, ends):
            times = [(s, e) for (code, *_), s, e in zip(ops, rank_starts, rank_ends)
                     if code == _COMPUTE]
            if times:
                value = max(value, times[-1][1] - times[0][0])
    return value if value < cutoff else None


class _CutOff(Exception):
    """Internal: the objective reached the cutoff."""


def _fits_in_order(compiled: "_Compiled", limit: float) -> bool:
    """Compute-only memory check in list order (a rank runs one action at a time, so the
    in-order running sum is the timed one); OFFLOAD/RELOAD schedules use ``simulate``."""
    costs = compiled.costs
    for ops in compiled.ops:
        memory = 0.0
        for code, _, _, _, delta in ops:
            if code == _OFFLOAD:
                delta = -costs.mem_f
            elif code == _RELOAD:
                delta = costs.mem_f
            memory += delta
            if memory > limit + 1e-9:
                return False
    return True


# ----- compilation ------------------------------------------------------------------
class _Compiled:
    """A compiled schedule's ops under one cost model (see ``compiled.py``)."""

    def __init__(self, schedule: Schedule | CompiledSchedule, costs: CostModel) -> None:
        structure = compile_schedule(schedule)
        self.schedule = structure.schedule
        self.costs = costs
        self.pp = structure.pp
        self.rank_of = structure.rank_of
        self.t_comm = float(costs.t_comm)
        self.ops = structure.ops(costs)
        self.decode = structure.decode
        self.describe = structure.describe
        self.actions = structure.actions


# ----- execution --------------------------------------------------------------------
def _run(compiled: _Compiled, *, cutoff: float = float("inf"), objective: str = "span"):
    plan = compiled.ops
    checking = cutoff < float("inf")
    span_objective = objective == "span"
    first_compute = [None] * compiled.pp  # per rank, for the span cutoff
    pp = compiled.pp
    pointer = [0] * pp
    free = [0.0] * pp
    link_free = [0.0] * pp
    end_of: dict[int, float] = {}
    starts = [[0.0] * len(ops) for ops in plan]
    ends = [[0.0] * len(ops) for ops in plan]
    waiters: dict[int, list[int]] = defaultdict(list)
    posted_recv: dict[int, tuple[int, int, float]] = {}  # send key -> recv (rank, pos, t)
    blocked_on: dict[int, int] = {}
    t_comm = compiled.t_comm
    t_send_cpu = float(compiled.costs.t_send_cpu)
    t_recv_cpu = float(compiled.costs.t_recv_cpu)
    stack = list(range(pp - 1, -1, -1))

    def resolve(key: int, time: float) -> None:
        end_of[key] = time
        if key in waiters:
            for waiter in waiters.pop(key):
                del blocked_on[waiter]
                stack.append(waiter)

    while stack:
        rank = stack.pop()
        ops = plan[rank]
        num_ops = len(ops)
        pos = pointer[rank]
        now = free[rank]
        rank_starts, rank_ends = starts[rank], ends[rank]
        while pos < num_ops:
            code, key, deps, duration, _ = ops[pos]
            if code == _COMPUTE:
                ready = now
                missing = None
                for dep_key, crosses in deps:
                    dep_end = end_of.get(dep_key)
                    if dep_end is None:
                        missing = dep_key
                        break
                    if crosses:
                        dep_end += t_comm
                    if dep_end > ready:
                        ready = dep_end
                if missing is not None:
                    waiters[missing].append(rank)
                    blocked_on[rank] = missing
                    break
                rank_starts[pos] = ready
                now = ready + duration
                rank_ends[pos] = now
                end_of[key] = now
                if checking:
                    if span_objective:
                        if first_compute[rank] is None:
                            first_compute[rank] = ready
                        if now - first_compute[rank] >= cutoff:
                            raise _CutOff
                    elif now >= cutoff:  # a stage-0 F starts at 0: makespan >= now
                        raise _CutOff
                if key in waiters:
                    resolve(key, now)
            elif code == _SEND:
                sent = max(now, end_of[deps[0][0]])
                rank_starts[pos] = sent
                rank_ends[pos] = sent + t_comm
                resolve(key, sent)  # keyed by issue time; the RECV adds the latency
                if t_send_cpu:
                    now = sent + t_send_cpu
                recv = posted_recv.pop(key, None)
                if recv is not None:
                    r_rank, r_pos, r_post = recv
                    arrival = max(r_post, sent + t_comm)
                    ends[r_rank][r_pos] = arrival
                    resolve(plan[r_rank][r_pos][1], arrival)
            elif code == _RECV:
                rank_starts[pos] = now
                if t_recv_cpu:
                    now += t_recv_cpu
                send_key, crosses = deps[0]
                latency = t_comm if crosses else 0.0
                sent = end_of.get(send_key)
                if sent is None:
                    posted_recv[send_key] = (rank, pos, now)
                else:
                    arrival = max(now, sent + latency)
                    rank_ends[pos] = arrival
                    resolve(key, arrival)
            elif code == _OFFLOAD or code == _RELOAD:
                begin = max(now, end_of[deps[0][0]], link_free[rank])
                link_free[rank] = begin + duration
                rank_starts[pos] = begin
                rank_ends[pos] = begin + duration
                resolve(key, begin + duration)
            else:  # marker
                rank_starts[pos] = rank_ends[pos] = now
            pos += 1
        pointer[rank] = pos
        free[rank] = now

    stuck = [r for r in range(pp) if pointer[r] < len(plan[r])]
    if stuck:
        lines = []
        for r in stuck:
            action = compiled.schedule.ranks[r][pointer[r]]
            why = blocked_on.get(r)
            wait = compiled.describe(why) if why is not None else "nothing (internal error)"
            lines.append(f"rank {r} blocked at {action.short()} (position {pointer[r]}) "
                         f"waiting for {wait}")
        raise DeadlockError("schedule deadlocks, no rank can progress:\n  "
                            + "\n  ".join(lines))
    return starts, ends, end_of


# ----- summary ----------------------------------------------------------------------
def _summarise(compiled: _Compiled, starts, ends, end_of, memory_limit) -> SimResult:
    costs = compiled.costs
    busy, span, per_rank_bubble, peaks, timelines = [], [], [], [], []
    first, last = float("inf"), float("-inf")
    for rank, ops in enumerate(compiled.ops):
        events: list[tuple[float, float]] = []
        rank_busy = 0.0
        rank_first, rank_last = float("inf"), 0.0
        rank_starts, rank_ends = starts[rank], ends[rank]
        if ops:
            first = min(first, min(rank_starts))
            last = max(last, max(rank_ends))
        for (code, _, _, duration, delta), s, e in zip(ops, rank_starts, rank_ends):
            if code == _COMPUTE:
                rank_busy += duration
                if s < rank_first:
                    rank_first = s
                rank_last = e
                if delta > 0:
                    events.append((s, delta))
                elif delta < 0:
                    events.append((e, delta))
            elif code == _OFFLOAD:
                events.append((e, -costs.mem_f))
            elif code == _RELOAD:
                events.append((s, costs.mem_f))
        events.sort()
        memory, peak, timeline = 0.0, 0.0, [(0.0, 0.0)]
        for time, delta in events:
            memory += delta
            if memory > peak:
                peak = memory
            timeline.append((time, memory))
        busy.append(rank_busy)
        rank_span = rank_last - rank_first if rank_busy > 0 or rank_last > 0 else 0.0
        rank_span = max(rank_span, 0.0)
        span.append(rank_span)
        per_rank_bubble.append(max(0.0, (rank_span - rank_busy) / rank_span)
                               if rank_span > 0 else 0.0)
        peaks.append(peak)
        timelines.append(timeline)
    longest = max(span, default=0.0)
    bubble = max(0.0, (longest - max(busy, default=0.0)) / longest) if longest > 0 else 0.0
    makespan = (last - first) if last > first else 0.0
    fits = memory_limit is None or all(p <= memory_limit + 1e-9 for p in peaks)
    return SimResult(makespan=makespan, bubble_rate=bubble,
                     max_stage_span=longest,
                     per_rank_bubble=per_rank_bubble, busy=busy, span=span,
                     peak_activation=peaks, memory_timeline=timelines,
                     memory_limit=memory_limit, fits_memory=fits,
                     overlaps=lambda: _overlaps(compiled, starts, ends, end_of),
                     rank_actions=compiled.actions, rank_starts=starts, rank_ends=ends)


def _overlaps(compiled: _Compiled, starts, ends, end_of) -> tuple[float, float]:
    """(comm_overlap, offload_overlap) of a finished run (computed when first read: the
    searches read neither)."""
    transfers: list[tuple[int, float, float]] = []  # (receiving rank, begin, end)
    host_link: list[tuple[int, float, float]] = []
    t_comm = compiled.t_comm
    for rank, ops in enumerate(compiled.ops):
        for (code, key, deps, _, _), s, e in zip(ops, starts[rank], ends[rank]):
            if code == _COMPUTE:
                if t_comm > 0:
                    for dep_key, crosses in deps:
                        if crosses:  # implicit transfer, lands after the producer ends
                            produced = end_of[dep_key]
                            transfers.append((rank, produced, produced + t_comm))
            elif code == _SEND:
                if t_comm > 0:
                    tag, stage, _ = compiled.decode(key)
                    consumer = compiled.rank_of[stage + 1 if tag == _KSF else stage - 1]
                    transfers.append((consumer, s, s + t_comm))
            elif code == _OFFLOAD or code == _RELOAD:
                host_link.append((rank, s, e))
    compute = None
    if transfers or host_link:
        compute = [[(s, e) for (code, *_), s, e in zip(ops, starts[r], ends[r])
                    if code == _COMPUTE] for r, ops in enumerate(compiled.ops)]
    return _overlap(transfers, compute), _overlap(host_link, compute)


def _overlap(transfers: list[tuple[int, float, float]], compute) -> float:
    """Fraction of the transfers' time covered by compute on the rank named with each."""
    total = sum(e - s for _, s, e in transfers)
    if total <= 0:
        return 1.0
    begins = [[iv[0] for iv in rank_iv] for rank_iv in compute]
    hidden = 0.0
    for rank, s, e in transfers:
        rank_iv = compute[rank]
        idx = max(bisect.bisect_right(begins[rank], s) - 1, 0)
        while idx < len(rank_iv) and rank_iv[idx][0] < e:
            lo, hi = max(s, rank_iv[idx][0]), min(e, rank_iv[idx][1])
            if hi > lo:
                hidden += hi - lo
            idx += 1
    return hidden / total
