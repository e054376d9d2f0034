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
from dataclasses import dataclass, field
from functools import cached_property

from .costs import CostModel
from .ir import COMPUTE_KINDS, Action, ActionKind, Schedule

__all__ = ["simulate", "score", "SimResult", "DeadlockError", "DependencyError",
           "OBJECTIVES"]

OBJECTIVES = ("span", "makespan")
"""What a schedule search minimises: ``span`` = the longest per-rank compute span (first
compute start to last compute end on a rank; the steady-state iteration time when
optimizer post-validation lets iterations overlap), ``makespan`` = first start to last
end over all ranks (runs that synchronise before the optimizer step)."""

# operation codes of compiled actions
_COMPUTE, _SEND, _RECV, _OFFLOAD, _RELOAD, _MARK = range(6)
# key tags: a key is the int ((tag * num_stages) + virtual stage) * mb_span + microbatch
_KF, _KB, _KW, _KSF, _KSB, _KRF, _KRB, _KOF, _KRL = range(9)
_TAG_OF_KIND = {
    ActionKind.F: _KF, ActionKind.B: _KB, ActionKind.BW: _KB, ActionKind.W: _KW,
    ActionKind.SEND_F: _KSF, ActionKind.SEND_B: _KSB, ActionKind.RECV_F: _KRF,
    ActionKind.RECV_B: _KRB, ActionKind.OFFLOAD: _KOF, ActionKind.RELOAD: _KRL,
}
_CODE_OF_KIND = {
    ActionKind.F: _COMPUTE, ActionKind.B: _COMPUTE, ActionKind.BW: _COMPUTE,
    ActionKind.W: _COMPUTE, ActionKind.SEND_F: _SEND, ActionKind.SEND_B: _SEND,
    ActionKind.RECV_F: _RECV, ActionKind.RECV_B: _RECV, ActionKind.OFFLOAD: _OFFLOAD,
    ActionKind.RELOAD: _RELOAD, ActionKind.POST_VALIDATION: _MARK,
}


class DependencyError(ValueError):
    """An action depends on something the schedule lacks or orders after it."""


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
    comm_overlap: float
    """Fraction of rank-to-rank transfer time during which the receiving rank computes
    (1.0 when there is no transfer time)."""
    offload_overlap: float
    """Fraction of host-link (offload/reload) time during which the rank computes."""
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
            "bubble_rate": self.bubble_rate,
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


def simulate(schedule: Schedule, costs: CostModel, *,
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


def score(schedule: Schedule, costs: CostModel, *, objective: str = "span",
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
    """Per-rank op tuples ``(code, key, deps, duration, mem_delta)`` with integer keys;
    ``deps`` is a tuple of (key, latency). Static dependency checks happen here."""

    def __init__(self, schedule: Schedule, costs: CostModel) -> None:
        self.schedule = schedule
        self.costs = costs
        self.pp = schedule.pp
        self.num_stages = schedule.num_stages
        self.stage = [[schedule.stage_of(r, c) for c in range(schedule.num_chunks)]
                      for r in range(schedule.pp)]
        self.rank_of = [schedule.locate(s)[0] for s in range(self.num_stages)]
        self.t_comm = float(costs.t_comm)
        mbs = [a.microbatch for a in schedule.actions()]
        self.mb_span = max(mbs, default=0) + 1
        self.where: dict[int, tuple[int, int]] = {}
        self.keys = self._index()
        self.ops = self._build()

    def key(self, tag: int, stage: int, mb: int) -> int:
        return (tag * self.num_stages + stage) * self.mb_span + mb

    def decode(self, key: int) -> tuple[int, int, int]:
        rest, mb = divmod(key, self.mb_span)
        tag, stage = divmod(rest, self.num_stages)
        return tag, stage, mb

    def describe(self, key: int) -> str:
        tag, stage, mb = self.decode(key)
        if not 0 <= stage < self.num_stages:
            return f"stage {stage} (outside the pipeline)"
        rank, chunk = self.schedule.locate(stage)
        kind = {_KF: "F", _KB: "B/BW", _KW: "W", _KSF: "SEND_F", _KSB: "SEND_B",
                _KRF: "RECV_F", _KRB: "RECV_B", _KOF: "OFFLOAD", _KRL: "RELOAD"}[tag]
        return f"{kind}{chunk}.{mb} (stage {stage}) on rank {rank}"

    def _index(self) -> list[list[int | None]]:
        keys = []
        num_chunks = self.schedule.num_chunks
        for rank, actions in enumerate(self.schedule.ranks):
            rank_keys: list[int | None] = []
            stage_of_chunk = self.stage[rank]
            for pos, action in enumerate(actions):
                if action.rank != rank:
                    raise DependencyError(f"{action.short()} says rank {action.rank} but is "
                                          f"in rank {rank}'s list")
                if action.kind is ActionKind.POST_VALIDATION:
                    rank_keys.append(None)
                    continue
                if not 0 <= action.chunk < num_chunks or action.microbatch < 0:
                    raise DependencyError(f"{action.short()} on rank {rank}: chunk or "
                                          f"microbatch out of range")
                key = self.key(_TAG_OF_KIND[action.kind], stage_of_chunk[action.chunk],
                               action.microbatch)
                if key in self.where:
                    other = self.where[key]
                    raise DependencyError(f"{action.short()} on rank {rank} position {pos} "
                                          f"duplicates rank {other[0]} position {other[1]}")
                self.where[key] = (rank, pos)
                rank_keys.append(key)
            keys.append(rank_keys)
        return keys

    def _build(self) -> list[list[tuple]]:
        costs, where = self.costs, self.where
        durations: dict[tuple, float] = {}
        memory = {kind: costs.memory_delta(kind) for kind in ActionKind}
        plan = []
        for rank, actions in enumerate(self.schedule.ranks):
            ops = []
            for pos, action in enumerate(actions):
                key = self.keys[rank][pos]
                code = _CODE_OF_KIND[action.kind]
                if key is None:
                    ops.append((_MARK, -1 - pos, (), 0.0, 0.0))
                    continue
                deps = self._deps_of(rank, key)
                for dep_key, _ in deps:
                    found = where.get(dep_key)
                    if found is None or (found[0] == rank and found[1] > pos) or (
                            action.kind is ActionKind.W):
                        self._check_dep(action, rank, pos, dep_key)
                duration = 0.0
                if code == _COMPUTE:
                    stage = self.stage[rank][action.chunk]
                    duration = durations.get((action.kind, stage))
                    if duration is None:
                        duration = durations[(action.kind, stage)] = costs.compute_time(
                            action.kind, stage=stage, rank=rank, pp=self.pp,
                            num_stages=self.num_stages)
                    duration *= costs.scale_of(action.microbatch)
                elif code in (_OFFLOAD, _RELOAD):
                    duration = costs.offload_time
                ops.append((code, key, deps, duration,
                            memory[action.kind] if code == _COMPUTE else 0.0))
            plan.append(ops)
        return plan

    def _deps_of(self, rank: int, key: int) -> tuple:
        tag, stage, mb = self.decode(key)
        k = self.key
        if tag == _KF:
            if stage == 0:
                return ()
            return (self._input_dep(rank, stage - 1, mb, _KF, _KRF, stage),)
        if tag == _KB:
            deps: tuple = ((k(_KF, stage, mb), 0.0),)
            if stage < self.num_stages - 1:
                deps += (self._input_dep(rank, stage + 1, mb, _KB, _KRB, stage),)
            if k(_KOF, stage, mb) in self.where:
                deps += ((k(_KRL, stage, mb), 0.0),)
            return deps
        if tag == _KW:
            return ((k(_KB, stage, mb), 0.0),)
        if tag == _KSF or tag == _KOF:
            return ((k(_KF, stage, mb), 0.0),)
        if tag == _KSB:
            return ((k(_KB, stage, mb), 0.0),)
        if tag == _KRF:
            return ((k(_KSF, stage - 1, mb), self.t_comm),) if stage > 0 else ((-1, 0.0),)
        if tag == _KRB:
            return (((k(_KSB, stage + 1, mb), self.t_comm),) if stage < self.num_stages - 1
                    else ((-1, 0.0),))
        if tag == _KRL:
            return ((k(_KOF, stage, mb), 0.0),)
        raise AssertionError(tag)

    def _input_dep(self, rank, producer_stage, mb, tag, recv_tag, stage):
        if self.rank_of[producer_stage] == rank:
            return (self.key(tag, producer_stage, mb), 0.0)
        recv = self.key(recv_tag, stage, mb)
        if recv in self.where:
            return (recv, 0.0)
        return (self.key(tag, producer_stage, mb), self.t_comm)

    def _check_dep(self, action, rank, pos, dep_key) -> None:
        found = self.where.get(dep_key)
        if found is None:
            if dep_key < 0:
                raise DependencyError(f"{action.short()} on rank {rank} position {pos} has "
                                      f"no neighbouring stage to pair with")
            hint = ""
            if action.kind is ActionKind.W:
                hint = " (a W needs a split B, not a fused BW)"
            raise DependencyError(f"{action.short()} on rank {rank} position {pos} needs "
                                  f"{self.describe(dep_key)}, which the schedule lacks{hint}")
        dep_rank, dep_pos = found
        if dep_rank == rank and dep_pos > pos:
            raise DependencyError(f"{action.short()} on rank {rank} position {pos} needs "
                                  f"{self.describe(dep_key)}, which comes later "
                                  f"(position {dep_pos}) on the same rank")
        if action.kind is ActionKind.W and \
                self.schedule.ranks[dep_rank][dep_pos].kind is ActionKind.BW:
            raise DependencyError(f"{action.short()} on rank {rank} follows a fused BW of "
                                  f"the same microbatch: the weight gradient is done twice")


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
                for dep_key, latency in deps:
                    dep_end = end_of.get(dep_key)
                    if dep_end is None:
                        missing = dep_key
                        break
                    if dep_end + latency > ready:
                        ready = dep_end + latency
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
                send_key, latency = deps[0]
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
    transfers: list[tuple[int, float, float]] = []  # (receiving rank, begin, end)
    host_link: list[tuple[int, float, float]] = []
    t_comm = compiled.t_comm
    for rank, ops in enumerate(compiled.ops):
        events: list[tuple[float, float]] = []
        rank_busy = 0.0
        rank_first, rank_last = float("inf"), 0.0
        rank_starts, rank_ends = starts[rank], ends[rank]
        if ops:
            first = min(first, min(rank_starts))
            last = max(last, max(rank_ends))
        for (code, key, deps, duration, delta), s, e in zip(ops, rank_starts, rank_ends):
            if code == _COMPUTE:
                rank_busy += duration
                if s < rank_first:
                    rank_first = s
                rank_last = e
                if delta > 0:
                    events.append((s, delta))
                elif delta < 0:
                    events.append((e, delta))
                if t_comm > 0:
                    for dep_key, latency in deps:
                        if latency > 0:  # implicit transfer, lands after the producer ends
                            produced = end_of[dep_key]
                            transfers.append((rank, produced, produced + latency))
            elif code == _SEND:
                if t_comm > 0:
                    tag, stage, _ = compiled.decode(key)
                    consumer = compiled.rank_of[stage + 1 if tag == _KSF else stage - 1]
                    transfers.append((consumer, s, s + t_comm))
            elif code == _OFFLOAD:
                host_link.append((rank, s, e))
                events.append((e, -costs.mem_f))
            elif code == _RELOAD:
                host_link.append((rank, s, e))
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
    compute = None
    if transfers or host_link:
        compute = [[(s, e) for (code, *_), s, e in zip(ops, starts[r], ends[r])
                    if code == _COMPUTE] for r, ops in enumerate(compiled.ops)]
    return SimResult(makespan=makespan, bubble_rate=bubble,
                     max_stage_span=longest,
                     per_rank_bubble=per_rank_bubble, busy=busy, span=span,
                     peak_activation=peaks, memory_timeline=timelines,
                     comm_overlap=_overlap(transfers, compute),
                     offload_overlap=_overlap(host_link, compute),
                     memory_limit=memory_limit, fits_memory=fits,
                     rank_actions=[list(r) for r in compiled.schedule.ranks],
                     rank_starts=starts, rank_ends=ends)


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
