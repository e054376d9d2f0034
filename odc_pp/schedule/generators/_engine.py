"""Greedy list scheduler shared by the memory-controlled families (ZB-H1/H2, ZB-V, V-Half, V-Min).

The engine plays the pipeline forward in time under a cost model: whenever a rank is
free it picks one ready compute action by a fixed priority and records it. The per-rank
order it records is the schedule; because the order was produced by a feasible timed run,
it can never deadlock, and its timing under the same cost model is the simulated one.

Memory control (the part that makes families differ) is a per-rank cap on the running
sum of activation deltas. A microbatch is *admitted* on a rank by the F of its chunk 0;
with two chunks, admission always leaves one ``mem_f`` slot free, so the chunk-1 forward
of the oldest admitted microbatch can always run (later microbatches cannot take their
chunk-1 forward before it). Together with "run a pending W when a ready F is blocked by
memory" and backward passes never needing memory (``mem_b <= 0``), any cap of at least
``num_chunks * mem_f`` is deadlock free: the oldest unfinished microbatch always
progresses.

Weight-gradient passes (W) are what the zero-bubble families use to fill idle time: a
rank runs W when nothing else is ready, or to free memory for a blocked forward.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ..costs import CostModel
from ..ir import Action, ActionKind, Placement
from ..placement import locate, num_stages, stage_of

__all__ = ["EngineConfig", "EngineResult", "EngineStalled", "run_engine"]

_EPS = 1e-9


@dataclass(kw_only=True)
class EngineConfig:
    """One greedy run: shape, placement, costs, memory caps and priority switches."""

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

    def __post_init__(self) -> None:
        if self.inject_interval < 0:
            raise ValueError(f"inject_interval must be >= 0, got {self.inject_interval}")
        if self.pair_gap is not None and not 0 <= self.pair_gap <= 2 * self.inject_interval:
            raise ValueError(f"pair_gap must lie in [0, 2 * inject_interval], got "
                             f"{self.pair_gap}")
        if self.num_chunks not in (1, 2):
            raise ValueError(f"the greedy engine handles 1 or 2 chunks, got {self.num_chunks}")
        if len(self.caps) != self.pp:
            raise ValueError(f"need one memory cap per rank ({self.pp}), got {len(self.caps)}")


class EngineStalled(ValueError):
    """The memory caps left no rank an action it may run."""


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
    def __init__(self, num_chunks: int) -> None:
        self.f_next = [0] * num_chunks
        self.b_next = [0] * num_chunks
        self.w_queue: deque[tuple[int, int]] = deque()
        self.mem = 0.0
        self.peak = 0.0
        self.free_at = 0.0
        self.first_start: float | None = None
        self.busy = 0.0
        self.order: list[Action] = []


class _Engine:
    def __init__(self, config: EngineConfig) -> None:
        self.cfg = config
        self.num_stages = num_stages(config.pp, config.num_chunks)
        self.states = [_RankState(config.num_chunks) for _ in range(config.pp)]
        self.f_end: dict[tuple[int, int], float] = {}  # (stage, mb) -> end time
        self.b_end: dict[tuple[int, int], float] = {}
        costs = config.costs
        self.mem_f, self.mem_b, self.mem_w = costs.mem_f, costs.mem_b, costs.mem_w
        if not config.split_backward:
            self.mem_b, self.mem_w = costs.mem_b + costs.mem_w, 0.0
        self.total = config.pp * config.num_chunks * config.num_microbatches * (
            3 if config.split_backward else 2)
        self.done = 0
        # lookup tables: stage of (rank, chunk); latency of its F input and B input
        chunks = range(config.num_chunks)
        self.stage = [[stage_of(config.placement, config.pp, r, c) for c in chunks]
                      for r in range(config.pp)]
        owner = [locate(config.placement, config.pp, config.num_chunks, s)[0]
                 for s in range(self.num_stages)]
        t_comm = costs.t_comm

        def latency(rank: int, stage: int) -> float:
            return t_comm if 0 <= stage < self.num_stages and owner[stage] != rank else 0.0

        self.f_latency = [[latency(r, self.stage[r][c] - 1) for c in chunks]
                          for r in range(config.pp)]
        self.b_latency = [[latency(r, self.stage[r][c] + 1) for c in chunks]
                          for r in range(config.pp)]
        self.durations = {
            (kind, r, c): costs.compute_time(kind, stage=self.stage[r][c], rank=r,
                                             pp=config.pp, num_stages=self.num_stages)
            for kind in (ActionKind.F, ActionKind.B, ActionKind.W, ActionKind.BW)
            for r in range(config.pp) for c in chunks}

    # ----- readiness --------------------------------------------------------------
    def _duration(self, kind: ActionKind, rank: int, chunk: int) -> float:
        return self.durations[(kind, rank, chunk)]

    def _forward_ready(self, rank: int, chunk: int) -> float | None:
        mb = self.states[rank].f_next[chunk]
        if mb >= self.cfg.num_microbatches:
            return None
        stage = self.stage[rank][chunk]
        if stage == 0:
            if self.cfg.pair_gap is None:
                return mb * self.cfg.inject_interval
            return (mb // 2) * 2 * self.cfg.inject_interval + (mb % 2) * self.cfg.pair_gap
        end = self.f_end.get((stage - 1, mb))
        return None if end is None else end + self.f_latency[rank][chunk]

    def _backward_ready(self, rank: int, chunk: int) -> float | None:
        state = self.states[rank]
        mb = state.b_next[chunk]
        if mb >= state.f_next[chunk]:
            return None
        stage = self.stage[rank][chunk]
        own = self.f_end[(stage, mb)]
        if stage == self.num_stages - 1:
            return own
        end = self.b_end.get((stage + 1, mb))
        return None if end is None else max(own, end + self.b_latency[rank][chunk])

    def _admissible(self, rank: int, chunk: int) -> bool:
        state = self.states[rank]
        cap = self.cfg.caps[rank] + _EPS
        if chunk == 0 and self.cfg.reserve_slot:
            # admission keeps one slot for the oldest microbatch's chunk-1 F
            return state.mem + self.mem_f * self.cfg.num_chunks <= cap
        return state.mem + self.mem_f <= cap

    # ----- choosing -----------------------------------------------------------------
    def _choose(self, rank: int, now: float) -> tuple[ActionKind, int, int] | None:
        cfg, state = self.cfg, self.states[rank]
        chunks = range(cfg.num_chunks)
        stages = self.stage[rank]
        backward = [(state.b_next[c], -stages[c], c) for c in chunks
                    if (t := self._backward_ready(rank, c)) is not None and t <= now + _EPS]
        forward = [(state.f_next[c], -stages[c], c) for c in chunks
                   if (t := self._forward_ready(rank, c)) is not None and t <= now + _EPS]
        admissible = [f for f in forward if self._admissible(rank, f[2])]
        bkind = ActionKind.B if cfg.split_backward else ActionKind.BW
        if cfg.w_after_b and state.w_queue:
            chunk, mb = state.w_queue[0]
            return ActionKind.W, chunk, mb
        if backward and (cfg.backward_first or not admissible):
            mb, _, chunk = min(backward)
            return bkind, chunk, mb
        if admissible:
            mb, _, chunk = min(admissible)
            return ActionKind.F, chunk, mb
        if state.w_queue:  # fills idle time, or frees memory for a blocked forward
            chunk, mb = state.w_queue[0]
            return ActionKind.W, chunk, mb
        return None

    def _execute(self, rank: int, now: float, kind: ActionKind, chunk: int, mb: int) -> None:
        state = self.states[rank]
        duration = self._duration(kind, rank, chunk)
        end = now + duration
        stage = self.stage[rank][chunk]
        if kind is ActionKind.F:
            state.f_next[chunk] += 1
            self.f_end[(stage, mb)] = end
            state.mem += self.mem_f
        elif kind in (ActionKind.B, ActionKind.BW):
            state.b_next[chunk] += 1
            self.b_end[(stage, mb)] = end
            state.mem += self.mem_b
            if kind is ActionKind.B:
                state.w_queue.append((chunk, mb))
        else:
            state.w_queue.popleft()
            state.mem += self.mem_w
        state.peak = max(state.peak, state.mem)
        if state.first_start is None:
            state.first_start = now
        state.busy += duration
        state.free_at = end
        state.order.append(Action(rank=rank, kind=kind, chunk=chunk, microbatch=mb))
        self.done += 1

    # ----- main loop --------------------------------------------------------------
    def run(self) -> EngineResult:
        now = 0.0
        while self.done < self.total:
            progressed = True
            while progressed:
                progressed = False
                for rank, state in enumerate(self.states):
                    if state.free_at <= now + _EPS:
                        choice = self._choose(rank, now)
                        if choice is not None:
                            self._execute(rank, now, *choice)
                            progressed = True
            if self.done >= self.total:
                break
            later = [s.free_at for s in self.states if s.free_at > now + _EPS]
            for rank in range(self.cfg.pp):
                for chunk in range(self.cfg.num_chunks):
                    for t in (self._forward_ready(rank, chunk), self._backward_ready(rank, chunk)):
                        if t is not None and t > now + _EPS:
                            later.append(t)
            if not later:
                raise EngineStalled(self._stuck_message())
            now = min(later)
        ends = [s.free_at for s in self.states]
        return EngineResult(
            ranks=[s.order for s in self.states],
            span=[s.free_at - (s.first_start or 0.0) for s in self.states],
            busy=[s.busy for s in self.states], makespan=max(ends),
            peak=[s.peak for s in self.states])

    def _stuck_message(self) -> str:
        worst = min(range(self.cfg.pp), key=lambda r: self.cfg.caps[r])
        return (f"memory limit {self.cfg.caps[worst]:g} on rank {worst} is too low for this "
                f"schedule: no action can run; raise memory_limit")


def run_engine(config: EngineConfig) -> EngineResult:
    """Play one greedy run; ValueError if a cap is below one microbatch on every chunk,
    ``EngineStalled`` if the caps stall every rank (only with ``reserve_slot=False`` when
    the caps are at least that)."""
    minimum = config.num_chunks * config.costs.mem_f
    for rank, cap in enumerate(config.caps):
        if cap + _EPS < minimum:
            raise ValueError(f"memory limit {cap:g} on rank {rank} is below {minimum:g}, the "
                             f"activations of one microbatch on all {config.num_chunks} "
                             f"chunk(s) of a rank; raise memory_limit")
    return _Engine(config).run()
