"""Memory-controlled V families: ZB-V, V-Half and V-Min (ZB-H2 is the paper's
handcrafted order, ``classic.zb_h2``).

Each family is a per-rank activation-memory cap (in the cost model's delta units; one
microbatch-chunk's forward adds ``mem_f``) plus a set of candidate orders; the generator
keeps the candidate with the smallest worst per-rank bubble under the given costs among
those whose peak fits the cap. Candidates are the greedy engine's variants (see
``_engine``; under a V cap below ZB-V's also paced runs without the admission reserve, see
``_paced_candidates``), the handcrafted ZB-V pattern where its peak fits, the repeating
building block of ``_block`` at the shortest interval that fits, and at ZB-V's budget the
zero-bubble paper's round-based construction (``_rounds``: its W placement adapts to
unequal costs and latency, where the handcrafted pattern stalls every microbatch).

The nominal caps (in ``mem_f`` units as a function of pp) are rows of the family
registry (``families.FAMILIES``, ``Family.nominal_cap``); the builders here take the cap
already resolved from any memory limit:

* the V families (arXiv 2405.15362, "Pipeline Parallelism with Controllable Memory"),
  whose paper counts memory in microbatches through all of a rank's layers, i.e. two
  V-chunk units each: ZB-V ``pp`` (``2 pp`` units, 1F1B's peak), V-Half ``(pp + 2) // 2``
  (``2 ((pp + 2) // 2)`` units), V-Min ``(pp + 4) // 3`` (``2 ((pp + 4) // 3)`` units).
  A memory limit replaces these budgets: any limit from ``2 mem_f`` (one microbatch on
  both chunks) up builds a schedule within it; the three names share one builder and
  differ only by their default budget.

At equal costs (F = B = W) and the paper's budgets the V-Min and V-Half bubbles stay
below 1F1B's and below the paper's approximations 2p/3m and p/2m
(``benchmarks/bench_v_schedules.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..costs import CostModel
from ..ir import Action, ActionKind, Placement, Schedule
from ..placement import locate, num_stages, stage_of
from ..simulator import score, simulate
from ._block import v_block_orders, v_block_peak
from ._engine import EngineConfig, EngineCutOff, EngineStalled, run_engine
from ._rounds import v_rounds_orders
from .classic import zbv_handcrafted, zbv_handcrafted_fits

__all__ = ["v_family"]


@dataclass
class _Candidate:
    ranks: list
    bubble: float
    makespan: float


_CUTOFF_MARGIN = 1e-7
"""Relative slack of the bubble cutoff: a candidate is abandoned only when its bubble
is certain to exceed the best one so far by more than this (ties are still decided by
makespan and candidate order, exactly as without cutoffs)."""


def _cutoff(best: float) -> float:
    return best + _CUTOFF_MARGIN * max(1.0, abs(best))


def _score(schedule: Schedule, costs: CostModel) -> tuple[float, float]:
    result = simulate(schedule, costs)
    return max(s - b for s, b in zip(result.span, result.busy)), result.makespan


def _tail_bound(pp: int, num_microbatches: int, costs: CostModel, last_start: float) -> float:
    """Lower bound on rank 0's bubble when the last microbatch's first forward cannot
    start before ``last_start``: rank 0 starts at 0 (microbatch 0's stage-0 forward), and
    ends no earlier than that microbatch's whole V chain (every forward, every backward,
    the transfers between ranks, then rank 0's W) after ``last_start``."""
    stages = num_stages(pp, 2)
    owners = [locate(Placement.V, pp, 2, stage)[0] for stage in range(stages)]

    def time(kind: ActionKind, stage: int) -> float:
        return costs.compute_time(kind, stage=stage, rank=owners[stage], pp=pp,
                                  num_stages=stages)
    hops = sum(1 for a, b in zip(owners, owners[1:]) if a != b)
    chain = (sum(time(ActionKind.F, s) + time(ActionKind.B, s) for s in range(stages)) +
             time(ActionKind.W, 0) + 2 * hops * costs.t_comm)
    busy = num_microbatches * sum(time(kind, stage) for stage in range(stages)
                                  if owners[stage] == 0
                                  for kind in (ActionKind.F, ActionKind.B, ActionKind.W))
    return last_start + chain - busy


def _engine_run(config_args: dict, may_stall: bool = False):
    """A candidate thunk: one list-scheduler run, abandoned past the bubble cutoff (and
    dropped if it stalls when ``may_stall``); skipped outright when its paced injection
    of the last microbatch already forces a bubble past the cutoff (``_tail_bound``)."""
    m = config_args["num_microbatches"]
    interval, gap = config_args["inject_interval"], config_args.get("pair_gap")
    last = ((m - 1) * interval if gap is None else
            ((m - 1) // 2) * 2 * interval + ((m - 1) % 2) * gap)
    bound = _tail_bound(config_args["pp"], m, config_args["costs"], last)

    def run(best: float) -> _Candidate | None:
        if bound > _cutoff(best):
            return None
        try:
            result = run_engine(EngineConfig(**config_args, bubble_cutoff=_cutoff(best)))
        except EngineCutOff:
            return None
        except EngineStalled:
            if may_stall:
                return None
            raise
        # the engine's timing is the in-order timing of the order it emits
        return _Candidate(result.ranks, result.max_bubble, result.makespan)
    return run


def _first(backward_first: bool) -> str:
    return "bfirst" if backward_first else "ffirst"


def _engine_candidates(pp: int, num_microbatches: int, costs: CostModel, cap: float,
                       intervals: dict[str, float]) -> list[tuple[str, object]]:
    """Greedy engine runs at each named injection interval, both backward priorities."""
    return [(f"engine-{pace}-{_first(backward_first)}",
             _engine_run(dict(pp=pp, num_microbatches=num_microbatches, num_chunks=2,
                              placement=Placement.V, costs=costs, caps=[cap] * pp,
                              backward_first=backward_first, inject_interval=interval)))
            for pace, interval in intervals.items() for backward_first in (True, False)]


def _paced_candidates(pp: int, num_microbatches: int, costs: CostModel,
                      cap: float) -> list[tuple[str, object]]:
    """V-placement engine runs without the admission reserve, paced in pairs.

    With a cap near a third of 1F1B's, the reserved slot halves what a rank may hold
    in flight (cap 3 admits only at memory 1), which caps throughput far below what the
    memory allows. Admitting whenever the forward fits, while pacing the input at about
    one microbatch per rank-work (``work``; pairs of microbatches close together and a
    longer gap after each pair), recovers most of it. Runs that stall are dropped.
    """
    work = _rank_work(pp, 2, Placement.V, costs)
    periods = {"1": (work, {"0": 0.0, "5/6": 5 / 6, "1": 1.0}),
               "13/12": (13 * work / 12, {"1": 1.0}),
               "7/6": (7 * work / 6, {"0": 0.0, "5/6": 5 / 6})}
    return [(f"pairs-{period_name}-gap{gap_name}",
             _engine_run(dict(pp=pp, num_microbatches=num_microbatches, num_chunks=2,
                              placement=Placement.V, costs=costs, caps=[cap] * pp,
                              inject_interval=period, pair_gap=gap * period,
                              reserve_slot=False), may_stall=True))
            for period_name, (period, gaps) in periods.items()
            for gap_name, gap in gaps.items()]


def _unreserved_candidates(pp: int, num_microbatches: int, costs: CostModel, cap: float,
                           interval: float) -> list[tuple[str, object]]:
    """V-placement engine runs without the admission reserve at a steady ``interval``
    (between V-Half's and ZB-V's budgets the reserve costs more than pacing does); runs
    that stall are dropped."""
    return [(f"unreserved-{_first(backward_first)}",
             _engine_run(dict(pp=pp, num_microbatches=num_microbatches, num_chunks=2,
                              placement=Placement.V, costs=costs, caps=[cap] * pp,
                              backward_first=backward_first, inject_interval=interval,
                              reserve_slot=False), may_stall=True))
            for backward_first in (True, False)]


def _rank_work(pp: int, num_chunks: int, placement: Placement, costs: CostModel) -> float:
    """Compute time one microbatch costs the busiest rank (F, B and W of all chunks)."""
    stages = num_stages(pp, num_chunks)
    return max(sum(costs.compute_time(kind, stage=stage_of(placement, pp, rank, chunk),
                                      rank=rank, pp=pp, num_stages=stages)
                   for kind in (ActionKind.F, ActionKind.B, ActionKind.W)
                   for chunk in range(num_chunks)) for rank in range(pp))


def _block_candidate(pp: int, num_microbatches: int, costs: CostModel, cap: float):
    """The V building block at the shortest interval (in unit slots) whose peak fits,
    found by bisection (the peak falls as the interval grows); None if none fits, else a
    candidate thunk (scored by the simulator, abandoned past the cutoff)."""

    def fits(interval: int) -> bool:
        return max(v_block_peak(pp, num_microbatches, interval, costs)) <= cap + 1e-9

    low, high = 6, 6 * pp + 6  # at ``high`` the copies of the block no longer overlap
    if not fits(high):
        return None
    while low < high:
        middle = (low + high) // 2
        if fits(middle):
            high = middle
        else:
            low = middle + 1
    # the rank with the most compute bounds every rank's busy time
    busiest = num_microbatches * _rank_work(pp, 2, Placement.V, costs)

    def run(best: float) -> _Candidate | None:
        orders = v_block_orders(pp, num_microbatches, high)
        # rank 0 runs everything before the last microbatch's first forward first
        last = Action(rank=0, kind=ActionKind.F, chunk=0, microbatch=num_microbatches - 1)
        position = orders[0].index(last)
        before = sum(costs.compute_time(a.kind, stage=stage_of(Placement.V, pp, 0, a.chunk),
                                        rank=0, pp=pp, num_stages=num_stages(pp, 2))
                     for a in orders[0][:position])
        if _tail_bound(pp, num_microbatches, costs, before) > _cutoff(best):
            return None
        schedule = Schedule(name="block", pp=pp, num_microbatches=num_microbatches,
                            num_chunks=2, placement=Placement.V, ranks=orders)
        # a span at or past cutoff + busiest means some rank's bubble exceeds the cutoff
        if score(schedule, costs, cutoff=_cutoff(best) + busiest) is None:
            return None
        return _Candidate(orders, *_score(schedule, costs))
    return run


def _rounds_candidates(pp: int, num_microbatches: int, costs: CostModel,
                       cap: float) -> list[tuple[str, object]]:
    """The zero-bubble paper's round-based ZB-V construction (``_rounds``), one thunk
    per (fill_b, fill_f) variant: dropped when its builder's clock already puts its
    bubble past the cutoff (as for the engine runs) or when it repeats an earlier
    variant's orders (which would lose the tie), else scored by the simulator."""
    seen: list = []

    def thunk(fill_b: bool, fill_f: bool):
        def run(best: float) -> _Candidate | None:
            built = v_rounds_orders(pp, num_microbatches, costs, cap, fill_f=fill_f,
                                    fill_b=fill_b)
            if built is None or built[0] > _cutoff(best) or built[1] in seen:
                return None
            seen.append(built[1])
            schedule = Schedule(name="rounds", pp=pp, num_microbatches=num_microbatches,
                                num_chunks=2, placement=Placement.V, ranks=built[1])
            return _Candidate(built[1], *_score(schedule, costs))
        return run
    return [(f"rounds-fill_b={int(fill_b)}-fill_f={int(fill_f)}", thunk(fill_b, fill_f))
            for fill_b in (True, False) for fill_f in (True, False)]


def _evaluation_order(names: list[str], pp: int, costs: CostModel, cap: float) -> list[int]:
    """Positions in ``names`` in the order to evaluate those candidates (speed only: the
    result does not depend on it). The likely winner goes first so that the others are
    abandoned early: at V-Min-like caps the runs paced in pairs at one rank-work, then the
    block; between V-Min's and ZB-V's caps the unreserved runs, then the engine runs paced
    at two thirds and a half of a rank's work; at ZB-V's cap the engine runs in their
    order."""
    if all(name.startswith("engine-") for name in names):
        first = ["engine-unpaced-bfirst", "engine-unpaced-ffirst", "engine-half-bfirst"]
    elif cap <= 2 * ((pp + 4) // 3) * costs.mem_f + 1e-9:
        first = ["pairs-1-gap0", "pairs-1-gap5/6", "pairs-1-gap1", "block"]
    else:
        first = ["unreserved-bfirst", "unreserved-ffirst", "engine-two-thirds-ffirst",
                 "engine-two-thirds-bfirst", "engine-half-ffirst", "engine-half-bfirst"]
    order = [names.index(name) for name in first if name in names]
    return order + [i for i in range(len(names)) if i not in order]


def v_family(name: str, pp: int, num_microbatches: int, costs: CostModel,
             cap: float) -> Schedule:
    """A V-placement schedule (2 chunks) within activation cap ``cap`` (any cap of at
    least one microbatch on both chunks, ``2 mem_f``); ``name`` (zbv, v-half, v-min)
    only labels it: the families differ by their nominal cap (see module doc).

    Candidates: greedy engine runs unpaced and paced at a half and two thirds of a rank's
    work per microbatch, both backward priorities; below ZB-V's ``2 pp`` also runs without
    the admission reserve, paced in pairs (they win under tight caps) or steadily at half
    a rank's work (between V-Half's and ZB-V's budgets); the handcrafted ZB-V
    pattern when its peak fits; the repeating building block at the shortest interval
    that fits; at ZB-V's budget (``2 pp mem_f``) the paper's round-based construction in
    its four W-fill variants (evaluated first). The one with the smallest worst per-rank
    bubble (then makespan, then the order listed here) wins; a handcrafted ZB-V with zero
    bubble is taken without building the others. Candidates are evaluated best-guess first and each is abandoned as soon
    as its bubble is certain to exceed the best so far (engine ``bubble_cutoff``,
    simulator ``score`` cutoff), which changes the time taken, never the result.
    """
    best: tuple | None = None  # (bubble, makespan, index) rounded, candidate
    if num_microbatches >= 2 * pp - 1:
        if zbv_handcrafted_fits(pp, num_microbatches, costs.memory_delta, cap + 1e-9):
            hand = zbv_handcrafted(pp, num_microbatches)
            candidate = _Candidate(hand.ranks, *_score(hand, costs))
            best = ((round(candidate.bubble, 9), round(candidate.makespan, 9), 0), candidate)
    if best is None or best[1].bubble > 1e-9:  # nothing beats zero bubble
        work = _rank_work(pp, 2, Placement.V, costs)
        thunks = _engine_candidates(pp, num_microbatches, costs, cap, intervals={
            "unpaced": 0.0, "half": work / 2, "two-thirds": 2 * work / 3})
        if cap < 2 * pp * costs.mem_f - 1e-9:
            thunks += _paced_candidates(pp, num_microbatches, costs, cap)
            thunks += _unreserved_candidates(pp, num_microbatches, costs, cap, work / 2)
        block = _block_candidate(pp, num_microbatches, costs, cap)
        if block is not None:
            thunks.append(("block", block))
        order = _evaluation_order([name for name, _ in thunks], pp, costs, cap)
        if cap >= 2 * pp * costs.mem_f - 1e-9:  # at ZB-V's budget: the paper's rounds
            order = list(range(len(thunks), len(thunks) + 4)) + order
            thunks += _rounds_candidates(pp, num_microbatches, costs, cap)
        for index in order:
            _, run = thunks[index]  # ties go to the earlier candidate in the list
            candidate = run(best[1].bubble if best else float("inf"))
            if candidate is None:
                continue
            key = (round(candidate.bubble, 9), round(candidate.makespan, 9), index + 1)
            if best is None or key < best[0]:
                best = (key, candidate)
    schedule = Schedule(name=name, pp=pp, num_microbatches=num_microbatches, num_chunks=2,
                        placement=Placement.V, ranks=[list(r) for r in best[1].ranks],
                        meta={"memory_limit": cap})
    schedule.meta["memory_unit"] = "V chunk (half of a rank's layers)"
    return schedule
