"""The one list scheduler: every searched or memory-controlled order is built here.

The scheduler plays the pipeline forward in time under a cost model: whenever a rank is
free it asks a *priority* (a pluggable policy, see :class:`Decision` and
:func:`default_priority`) for one ready compute action, runs it and records it. The
per-rank order it records is the schedule; because the order was produced by a feasible
timed run it never deadlocks. The scheduler keeps its own clock only to decide what is
ready; the timing of a schedule is defined by ``odc_pp.schedule.simulator`` alone
(callers score the emitted orders there; the engine's clock is the same in-order timing
with implicit communication).

The run is event driven: a heap of (time, rank) wake-ups, a rank is woken when it
becomes free, when a neighbour produces the input it waits for (at the arrival time),
or at a known future ready time (paced injection, a W-slack wait). One run of N actions
costs O(N log N) plus the priority's work per decision.

Memory control is a per-rank cap on the running sum of activation deltas. A microbatch
is *admitted* on a rank by the F of its chunk 0; with two chunks, admission always leaves
one ``mem_f`` slot free (``reserve_slot``), so the chunk-1 forward of the oldest admitted
microbatch can always run. Together with "run a pending W when a ready F is blocked by
memory" and backward passes never needing memory (``mem_b <= 0``), any cap of at least
``num_chunks * mem_f`` is deadlock free. ``inflight`` additionally bounds how many
microbatches a rank holds between its chunk-0 F and chunk-0 B (the warm-up depth the
ZB-auto search tunes per rank).
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from typing import Callable, NamedTuple

from ..costs import CostModel
from ..ir import Action, ActionKind, Placement
from ..placement import locate, num_stages, stage_of

__all__ = ["EngineConfig", "EngineResult", "EngineStalled", "EngineCutOff", "run_engine",
           "Decision", "Priority", "default_priority"]

_EPS = 1e-9
_INF = float("inf")
_F, _B, _W = ActionKind.F, ActionKind.B, ActionKind.W
_KINDS = (ActionKind.F, ActionKind.B, ActionKind.W, ActionKind.BW)
_CODE = {kind: code for code, kind in enumerate(_KINDS)}
_NUM_CODES = len(_KINDS)


class Decision(NamedTuple):
    """What a free rank may do now; a priority picks one of these or nothing.

    Items are ``(microbatch, -stage, chunk)`` tuples, so ``min`` gives the oldest
    microbatch, deepest stage first. (A named tuple: one is built per decision.)
    """

    rank: int
    now: float
    backward: list
    """Ready backward passes (B, or BW without ``split_backward``)."""
    forward: list
    """Ready forward passes that the memory cap and ``inflight`` admit."""
    blocked_forward: bool
    """A forward is ready but memory or ``inflight`` holds it back."""
    w_queue: deque
    """Pending weight-gradient passes (chunk, microbatch), oldest first."""
    next_input: float
    """Earliest time a B or admissible F could become ready (``inf``: unknown, i.e. no
    earlier than a neighbour's next action)."""
    t_w: float
    """Duration of the oldest pending W (0 when none)."""
    config: "EngineConfig"
    next_backward: float = _INF
    """Earliest known future arrival of a backward input (``inf``: none known)."""
    t_f: float = 0.0
    """Duration of the oldest admissible ready forward (0 when none)."""
    input_estimate: float = _INF
    """Earliest a B or admissible F input could arrive: ``next_input``, or for an input
    whose producer has not started, now plus the producer's duration and the transfer."""


Choice = tuple  # ("B" | "F" | "W" | "idle", item or wake time)
Priority = Callable[[Decision], "Choice | None"]
"""``priority(decision)`` returns ``("B", item)``, ``("F", item)``, ``("W", None)``,
``("idle", until)`` (wait until ``until`` or a neighbour's next output) or None (idle
until a neighbour's next output)."""


def default_priority(decision: Decision) -> Choice | None:
    """The switches of :class:`EngineConfig`: ``w_after_b`` runs each W right after its
    B; ``backward_first`` prefers a ready B to a ready F; a W fills any idle time, or
    with ``w_slack`` only when it ends before the next input arrives plus ``w_slack``
    times its duration (otherwise the rank waits for that input)."""
    cfg = decision.config
    if cfg.w_after_b and decision.w_queue:
        return ("W", None)
    if decision.backward and (cfg.backward_first or not decision.forward):
        return ("B", min(decision.backward))
    if decision.forward:
        if cfg.forward_yields is not None and cfg.forward_yields[decision.rank] and \
                decision.now + decision.t_f > decision.next_backward + _EPS:
            return ("idle", decision.next_backward)  # the F would delay a coming B
        return ("F", min(decision.forward))
    if not decision.w_queue:
        return None
    if cfg.w_slack is None or decision.blocked_forward:
        return ("W", None)  # fills idle time, or frees memory for a blocked forward
    if decision.now + decision.t_w <= decision.input_estimate + cfg.w_slack * decision.t_w:
        return ("W", None)
    return ("idle", decision.next_input)


@dataclass(kw_only=True)
class EngineConfig:
    """One list-scheduler run: shape, placement, costs, memory caps and priority."""

    pp: int
    """Pipeline ranks."""
    num_microbatches: int
    """Microbatches per minibatch."""
    num_chunks: int
    """Model chunks per rank."""
    placement: Placement
    """How (rank, chunk) maps to virtual stages."""
    costs: CostModel
    """Durations, communication latency and memory deltas."""
    caps: list[float]
    """Per-rank cap on the running sum of activation deltas."""
    split_backward: bool = True
    """Emit B and W separately (False: fused BW)."""
    backward_first: bool = True
    """When both a B and an admissible F are ready, run the B first."""
    inject_interval: float = 0.0
    """Pace the pipeline: microbatch ``j`` enters stage 0 no earlier than ``j`` times this
    (a steady admission rate keeps a tight memory cap from starving the pipeline)."""
    w_after_b: bool = False
    """Run each W right after its B (1F1B-style), instead of keeping W to fill idle time."""
    pair_gap: float | None = None
    """Pace microbatches in pairs instead: pair ``k`` enters at ``2 k inject_interval``,
    its second microbatch ``pair_gap`` later (a tight cap can often hold two
    microbatches close together if the pair is then followed by a longer gap)."""
    reserve_slot: bool = True
    """Admission keeps one ``mem_f`` slot free for the oldest microbatch's chunk-1
    forward (provably deadlock free, see module doc). False admits whenever the forward
    fits the cap: more throughput under a tight cap, but a run may stall, in which case
    ``run_engine`` raises ``EngineStalled`` and the caller drops that variant."""
    inflight: list[int] | None = None
    """Per rank, most microbatches between their chunk-0 F and chunk-0 B (None: only the
    memory cap limits admission)."""
    w_slack: float | None = None
    """None: a W fills any idle moment. A number: a W runs only if it ends before the
    next input can arrive plus this many W durations (else the rank waits)."""
    forward_yields: list[bool] | None = None
    """Per rank: a ready F waits instead when a B input arrives before the F would end
    (keeps the backward chain fast at the cost of that rank's idle time)."""
    priority: Priority | None = None
    """Policy choosing among the ready actions (None: :func:`default_priority`)."""
    bubble_cutoff: float = _INF
    """Stop with ``EngineCutOff`` as soon as a rank's idle time since its first action
    exceeds this: the run's worst per-rank bubble (``max_bubble``) can then only be
    larger. A caller keeping the best of several runs passes the best bubble so far."""

    def __post_init__(self) -> None:
        if self.inject_interval < 0:
            raise ValueError(f"inject_interval must be >= 0, got {self.inject_interval}")
        if self.pair_gap is not None and not 0 <= self.pair_gap <= 2 * self.inject_interval:
            raise ValueError(f"pair_gap must lie in [0, 2 * inject_interval], got "
                             f"{self.pair_gap}")
        if self.num_chunks not in (1, 2):
            raise ValueError(f"the list scheduler handles 1 or 2 chunks, got "
                             f"{self.num_chunks}")
        if len(self.caps) != self.pp:
            raise ValueError(f"need one memory cap per rank ({self.pp}), got {len(self.caps)}")
        if self.inflight is not None and (len(self.inflight) != self.pp or
                                          min(self.inflight) < 1):
            raise ValueError(f"inflight needs one integer >= 1 per rank ({self.pp}), got "
                             f"{self.inflight}")
        if self.forward_yields is not None and len(self.forward_yields) != self.pp:
            raise ValueError(f"forward_yields needs one flag per rank ({self.pp})")
        if self.bubble_cutoff < 0:
            raise ValueError(f"bubble_cutoff must be >= 0, got {self.bubble_cutoff}")
        if self.w_slack is not None and self.w_slack < 0:
            raise ValueError(f"w_slack must be >= 0, got {self.w_slack}")


class EngineStalled(ValueError):
    """The memory caps left no rank an action it may run."""


class EngineCutOff(Exception):
    """A rank's idle time exceeded ``EngineConfig.bubble_cutoff``: the run's worst
    per-rank bubble is above the cutoff."""


@dataclass
class EngineResult:
    ranks: list[list[Action]]
    span: list[float]
    """Per rank: end of its last action minus start of its first."""
    busy: list[float]
    """Per rank: total compute time."""
    makespan: float
    peak: list[float]

    @property
    def max_bubble(self) -> float:
        return max(s - b for s, b in zip(self.span, self.busy))


class _RankState:
    __slots__ = ("f_next", "b_next", "w_queue", "mem", "peak", "free_at", "first_start",
                 "idle", "busy", "order")

    def __init__(self, num_chunks: int) -> None:
        self.f_next = [0] * num_chunks
        self.b_next = [0] * num_chunks
        self.w_queue: deque[tuple[int, int]] = deque()
        self.mem = 0.0
        self.peak = 0.0
        self.free_at = 0.0
        self.first_start: float | None = None
        self.idle = 0.0
        self.busy = 0.0
        self.order: list[int] = []  # (microbatch, chunk, kind) packed, see _Engine._action


class _Engine:
    def __init__(self, config: EngineConfig) -> None:
        self.cfg = config
        self.priority = config.priority or default_priority
        self.num_stages = num_stages(config.pp, config.num_chunks)
        self.states = [_RankState(config.num_chunks) for _ in range(config.pp)]
        # [stage][mb] -> end time (None: not run yet)
        self.f_end: list[list[float | None]] = [[None] * config.num_microbatches
                                                for _ in range(self.num_stages)]
        self.b_end: list[list[float | None]] = [[None] * config.num_microbatches
                                                for _ in range(self.num_stages)]
        costs = config.costs
        self.mem_f, self.mem_b, self.mem_w = costs.mem_f, costs.mem_b, costs.mem_w
        if not config.split_backward:
            self.mem_b, self.mem_w = costs.mem_b + costs.mem_w, 0.0
        self.total = config.pp * config.num_chunks * config.num_microbatches * (
            3 if config.split_backward else 2)
        self.done = 0
        self.bubble_cutoff = config.bubble_cutoff
        chunks = range(config.num_chunks)
        self.stage = [[stage_of(config.placement, config.pp, r, c) for c in chunks]
                      for r in range(config.pp)]
        self.owner = [locate(config.placement, config.pp, config.num_chunks, s)
                      for s in range(self.num_stages)]
        t_comm = self.t_comm = costs.t_comm
        self.owner_rank = [rank for rank, _ in self.owner]
        self.last_stage = self.num_stages - 1

        def latency(rank: int, stage: int) -> float:
            return (t_comm if 0 <= stage < self.num_stages and self.owner[stage][0] != rank
                    else 0.0)

        self.f_latency = [[latency(r, self.stage[r][c] - 1) for c in chunks]
                          for r in range(config.pp)]
        self.b_latency = [[latency(r, self.stage[r][c] + 1) for c in chunks]
                          for r in range(config.pp)]
        self.durations = {
            (kind, r, c): costs.compute_time(kind, stage=self.stage[r][c], rank=r,
                                             pp=config.pp, num_stages=self.num_stages)
            for kind in (ActionKind.F, ActionKind.B, ActionKind.W, ActionKind.BW)
            for r in range(config.pp) for c in chunks}
        self.kind_durations = {kind: [[self.durations[(kind, r, c)] for c in chunks]
                                      for r in range(config.pp)] for kind in ActionKind
                               if kind in (ActionKind.F, ActionKind.B, ActionKind.W,
                                           ActionKind.BW)}
        self.heap: list[tuple[float, int]] = []
        self.scheduled = [_INF] * config.pp
        # per (rank, chunk): own F/W time; a producer's time plus the transfer (estimates)
        self.f_duration = [[self.durations[(ActionKind.F, r, c)] for c in chunks]
                           for r in range(config.pp)]
        self.w_duration = [[self.durations[(ActionKind.W, r, c)] for c in chunks]
                           for r in range(config.pp)]

        def producer(kind: ActionKind, stage: int) -> float:
            if not 0 <= stage < self.num_stages:
                return 0.0
            return self.durations[(kind, *self.owner[stage])]
        self.b_producer = [[producer(ActionKind.B, self.stage[r][c] + 1) + self.b_latency[r][c]
                            for c in chunks] for r in range(config.pp)]
        self.f_producer = [[producer(ActionKind.F, self.stage[r][c] - 1) + self.f_latency[r][c]
                            for c in chunks] for r in range(config.pp)]
        # admission: the cap with its tolerance, and the room a chunk-0 F needs
        self.caps_eps = [cap + _EPS for cap in config.caps]
        self.mem_f_all = self.mem_f * config.num_chunks
        # stage-0 injection time of each microbatch (paced, steadily or in pairs)
        interval, gap = config.inject_interval, config.pair_gap
        self.inject_at = [mb * interval if gap is None else
                          (mb // 2) * 2 * interval + (mb % 2) * gap
                          for mb in range(config.num_microbatches)]
        self.estimating = config.w_slack is not None  # only the W-slack rule reads them
        self.yielding = config.forward_yields is not None

    # ----- admission --------------------------------------------------------------
    def _admission(self, rank: int) -> tuple[bool, bool]:
        """Whether a forward of chunk 0 (admitting a microbatch) and of chunk 1 fits now
        (chunk 0: ``inflight``, and with ``reserve_slot`` one ``mem_f`` kept free for the
        oldest microbatch's chunk-1 F)."""
        state, cfg = self.states[rank], self.cfg
        cap = self.caps_eps[rank]
        fits = state.mem + self.mem_f <= cap
        if cfg.inflight is not None and \
                state.f_next[0] - state.b_next[0] >= cfg.inflight[rank]:
            return False, fits
        if cfg.reserve_slot:
            return state.mem + self.mem_f_all <= cap, fits
        return fits, fits

    # ----- choosing -----------------------------------------------------------------
    def _decision(self, rank: int, now: float) -> Decision:
        state, cfg = self.states[rank], self.cfg
        stages = self.stage[rank]
        backward, forward, blocked = [], [], False
        next_input = next_backward = estimate = _INF
        estimating, yielding = self.estimating, self.yielding
        soon = now + _EPS
        f_end, b_end, m = self.f_end, self.b_end, cfg.num_microbatches
        last_stage = self.last_stage
        b_latency, f_latency = self.b_latency[rank], self.f_latency[rank]
        f_next, b_next = state.f_next, state.b_next
        admission = None
        for c in range(cfg.num_chunks):
            stage = stages[c]
            b_mb, f_mb = b_next[c], f_next[c]
            # the next backward: ready once its own F and the next stage's B are done
            if b_mb < f_mb:
                t = f_end[stage][b_mb]
                if stage != last_stage:
                    end = b_end[stage + 1][b_mb]
                    if end is None:
                        t = None
                    else:
                        end += b_latency[c]
                        if end > t:
                            t = end
                if t is None:
                    if estimating:  # producer not started
                        estimate = min(estimate, now + self.b_producer[rank][c])
                elif t <= soon:
                    backward.append((b_mb, -stage, c))
                else:
                    if t < next_input:
                        next_input = t
                    if yielding and t < next_backward:
                        next_backward = t
            # the next forward: paced injection on stage 0, else the previous stage's F
            if f_mb >= m:
                continue
            if admission is None:
                admission = self._admission(rank)
            admissible = admission[c]
            if stage == 0:
                t = self.inject_at[f_mb]
            else:
                end = f_end[stage - 1][f_mb]
                if end is None:
                    if estimating and admissible:
                        estimate = min(estimate, now + self.f_producer[rank][c])
                    continue
                t = end + f_latency[c]
            if t <= soon:
                if admissible:
                    forward.append((f_mb, -stage, c))
                else:
                    blocked = True
            elif admissible and t < next_input:
                next_input = t
        t_w = self.w_duration[rank][state.w_queue[0][0]] if state.w_queue else 0.0
        t_f = self.f_duration[rank][min(forward)[2] if len(forward) > 1 else
                                    forward[0][2]] if forward else 0.0
        return Decision(rank, now, backward, forward, blocked, state.w_queue, next_input,
                        t_w, cfg, next_backward, t_f,
                        next_input if next_input < estimate else estimate)

    def _execute(self, rank: int, now: float, kind: ActionKind, chunk: int, mb: int) -> float:
        state = self.states[rank]
        duration = self.kind_durations[kind][rank][chunk]
        end = now + duration
        stage = self.stage[rank][chunk]
        if kind is _F:
            state.f_next[chunk] += 1
            self.f_end[stage][mb] = end
            state.mem += self.mem_f
            if stage < self.last_stage:
                consumer = self.owner_rank[stage + 1]
                self._wake(consumer, end + self.t_comm if consumer != rank else end)
        elif kind is _W:
            state.w_queue.popleft()
            state.mem += self.mem_w
        else:  # B or BW
            state.b_next[chunk] += 1
            self.b_end[stage][mb] = end
            state.mem += self.mem_b
            if kind is _B:
                state.w_queue.append((chunk, mb))
            if stage > 0:
                consumer = self.owner_rank[stage - 1]
                self._wake(consumer, end + self.t_comm if consumer != rank else end)
        if state.mem > state.peak:
            state.peak = state.mem
        if state.first_start is None:
            state.first_start = now
        else:
            state.idle += now - state.free_at
            if state.idle > self.bubble_cutoff:
                raise EngineCutOff(f"rank {rank} idle {state.idle:g} > cutoff "
                                   f"{self.cfg.bubble_cutoff:g}")
        state.busy += duration
        state.free_at = end
        # one int per action (no container for the collector to track); Actions are
        # built for finished runs only
        state.order.append((mb * self.cfg.num_chunks + chunk) * _NUM_CODES + _CODE[kind])
        self.done += 1
        return end

    def _wake(self, rank: int, at: float) -> None:
        free = self.states[rank].free_at
        if free > at:
            at = free
        if at < self.scheduled[rank]:
            self.scheduled[rank] = at
            heapq.heappush(self.heap, (at, rank))

    # ----- main loop --------------------------------------------------------------
    def run(self) -> EngineResult:
        bkind = ActionKind.B if self.cfg.split_backward else ActionKind.BW
        for rank in range(self.cfg.pp):
            self._wake(rank, 0.0)
        heap, scheduled, states = self.heap, self.scheduled, self.states
        decide, priority = self._decision, self.priority
        heappop, heappush = heapq.heappop, heapq.heappush
        while heap:
            now, rank = heappop(heap)
            if now != scheduled[rank]:
                continue  # superseded by an earlier wake-up
            scheduled[rank] = _INF
            state = states[rank]
            if state.free_at > now + _EPS:
                self._wake(rank, state.free_at)
                continue
            decision = decide(rank, now)
            choice = priority(decision)
            if choice is None or choice[0] == "idle":
                wake = decision.next_input if choice is None else choice[1]
                if wake < _INF:
                    self._wake(rank, max(wake, now))
                continue
            what, item = choice
            if what == "W":
                if not state.w_queue:
                    raise ValueError(f"priority chose W on rank {rank} with none pending")
                chunk, mb = state.w_queue[0]
                end = self._execute(rank, now, _W, chunk, mb)
            else:
                mb, _, chunk = item
                end = self._execute(rank, now, bkind if what == "B" else _F, chunk, mb)
            if self.done < self.total and end < scheduled[rank]:
                scheduled[rank] = end  # the rank is free again at ``end`` (its free_at)
                heappush(heap, (end, rank))
        if self.done < self.total:
            raise EngineStalled(self._stuck_message())
        ends = [s.free_at for s in self.states]
        return EngineResult(
            ranks=[[self._action(rank, code) for code in state.order]
                   for rank, state in enumerate(self.states)],
            span=[s.free_at - (s.first_start or 0.0) for s in self.states],
            busy=[s.busy for s in self.states], makespan=max(ends),
            peak=[s.peak for s in self.states])

    def _action(self, rank: int, code: int) -> Action:
        rest, kind = divmod(code, _NUM_CODES)
        mb, chunk = divmod(rest, self.cfg.num_chunks)
        return Action(rank=rank, kind=_KINDS[kind], chunk=chunk, microbatch=mb)

    def _stuck_message(self) -> str:
        worst = min(range(self.cfg.pp), key=lambda r: self.cfg.caps[r])
        return (f"memory limit {self.cfg.caps[worst]:g} on rank {worst} is too low for this "
                f"schedule: no action can run; raise memory_limit")


def run_engine(config: EngineConfig) -> EngineResult:
    """Play one list-scheduler run; ValueError if a cap is below one microbatch on every
    chunk, ``EngineStalled`` if the caps stall every rank (only with
    ``reserve_slot=False`` or ``inflight`` when the caps are at least that),
    ``EngineCutOff`` once the bubble is certain to exceed ``bubble_cutoff``."""
    minimum = config.num_chunks * config.costs.mem_f
    for rank, cap in enumerate(config.caps):
        if cap + _EPS < minimum:
            raise ValueError(f"memory limit {cap:g} on rank {rank} is below {minimum:g}, the "
                             f"activations of one microbatch on all {config.num_chunks} "
                             f"chunk(s) of a rank; raise memory_limit")
    return _Engine(config).run()
