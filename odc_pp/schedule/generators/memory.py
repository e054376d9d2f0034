"""Memory-controlled V families: ZB-V, V-Half and V-Min (ZB-H2 is the paper's
handcrafted order, ``classic.zb_h2``).

Each family is a per-rank activation-memory cap (in the cost model's delta units; one
microbatch-chunk's forward adds ``mem_f``) plus a set of candidate orders; the generator
keeps the candidate with the smallest worst per-rank bubble under the given costs among
those whose peak fits the cap. Candidates are the greedy engine's variants (see
``_engine``; under a V cap below ZB-V's also paced runs without the admission reserve, see
``_paced_candidates``), the handcrafted ZB-V pattern where its peak fits, and for V
placements the repeating building block of ``_block`` at the shortest interval that fits.

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
from ..ir import ActionKind, Placement, Schedule
from ..placement import num_stages, stage_of
from ..simulator import simulate
from ._block import order_peak, v_block_orders
from ._engine import EngineConfig, EngineStalled, run_engine
from .classic import zbv_handcrafted

__all__ = ["v_family"]


@dataclass
class _Candidate:
    ranks: list
    bubble: float
    makespan: float


def _score(schedule: Schedule, costs: CostModel) -> tuple[float, float]:
    result = simulate(schedule, costs)
    return max(s - b for s, b in zip(result.span, result.busy)), result.makespan


def _engine_candidates(pp: int, num_microbatches: int, num_chunks: int,
                       placement: Placement, costs: CostModel, cap: float,
                       intervals: tuple[float, ...] = (0.0,),
                       w_after_b: tuple[bool, ...] = (False, True)) -> list[_Candidate]:
    out = []
    for interval in intervals:
        for backward_first in (True, False):
            for w_after in w_after_b:
                result = run_engine(EngineConfig(
                    pp=pp, num_microbatches=num_microbatches, num_chunks=num_chunks,
                    placement=placement, costs=costs, caps=[cap] * pp,
                    backward_first=backward_first, w_after_b=w_after,
                    inject_interval=interval))
                # the engine's timing is the in-order timing of the order it emits
                out.append(_Candidate(result.ranks, result.max_bubble, result.makespan))
    return out


def _paced_candidates(pp: int, num_microbatches: int, costs: CostModel,
                      cap: float) -> list[_Candidate]:
    """V-placement engine runs without the admission reserve, paced in pairs.

    With a cap near a third of 1F1B's, the reserved slot halves what a rank may hold
    in flight (cap 3 admits only at memory 1), which caps throughput far below what the
    memory allows. Admitting whenever the forward fits, while pacing the input at about
    one microbatch per rank-work (``work``; pairs of microbatches close together and a
    longer gap after each pair), recovers most of it. Runs that stall are dropped.
    """
    work = _rank_work(pp, 2, Placement.V, costs)
    out = []
    for period, gaps in ((work, (0.0, 5 / 6, 1.0)), (13 * work / 12, (1.0,)),
                         (7 * work / 6, (0.0, 5 / 6))):
        for gap in gaps:
            try:
                result = run_engine(EngineConfig(
                    pp=pp, num_microbatches=num_microbatches, num_chunks=2,
                    placement=Placement.V, costs=costs, caps=[cap] * pp,
                    inject_interval=period, pair_gap=gap * period, reserve_slot=False))
            except EngineStalled:
                continue
            out.append(_Candidate(result.ranks, result.max_bubble, result.makespan))
    return out


def _unreserved_candidates(pp: int, num_microbatches: int, costs: CostModel, cap: float,
                           interval: float) -> list[_Candidate]:
    """V-placement engine runs without the admission reserve at a steady ``interval``
    (between V-Half's and ZB-V's budgets the reserve costs more than pacing does); runs
    that stall are dropped."""
    out = []
    for backward_first in (True, False):
        try:
            result = run_engine(EngineConfig(
                pp=pp, num_microbatches=num_microbatches, num_chunks=2,
                placement=Placement.V, costs=costs, caps=[cap] * pp,
                backward_first=backward_first, inject_interval=interval,
                reserve_slot=False))
        except EngineStalled:
            continue
        out.append(_Candidate(result.ranks, result.max_bubble, result.makespan))
    return out


def _rank_work(pp: int, num_chunks: int, placement: Placement, costs: CostModel) -> float:
    """Compute time one microbatch costs the busiest rank (F, B and W of all chunks)."""
    stages = num_stages(pp, num_chunks)
    return max(sum(costs.compute_time(kind, stage=stage_of(placement, pp, rank, chunk),
                                      rank=rank, pp=pp, num_stages=stages)
                   for kind in (ActionKind.F, ActionKind.B, ActionKind.W)
                   for chunk in range(num_chunks)) for rank in range(pp))


def _pick(name: str, pp: int, num_microbatches: int, num_chunks: int, placement: Placement,
          costs: CostModel, cap: float, candidates: list[_Candidate]) -> Schedule:
    best = min(candidates, key=lambda c: (round(c.bubble, 9), round(c.makespan, 9)))
    return Schedule(name=name, pp=pp, num_microbatches=num_microbatches,
                    num_chunks=num_chunks, placement=placement,
                    ranks=[list(r) for r in best.ranks], meta={"memory_limit": cap})


def _block_candidate(pp: int, num_microbatches: int, costs: CostModel,
                     cap: float) -> _Candidate | None:
    """The V building block at the shortest interval (in unit slots) whose peak fits,
    found by bisection (the peak falls as the interval grows)."""

    def fitting(interval: int):
        orders = v_block_orders(pp, num_microbatches, interval)
        return orders if max(order_peak(orders, costs)) <= cap + 1e-9 else None

    low, high = 6, 6 * pp + 6  # at ``high`` the copies of the block no longer overlap
    best = fitting(high)
    if best is None:
        return None
    while low < high:
        middle = (low + high) // 2
        orders = fitting(middle)
        if orders is None:
            low = middle + 1
        else:
            high, best = middle, orders
    schedule = Schedule(name="block", pp=pp, num_microbatches=num_microbatches,
                        num_chunks=2, placement=Placement.V, ranks=best)
    return _Candidate(best, *_score(schedule, costs))


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
    that fits. The one with the smallest worst per-rank bubble (then makespan) wins; a
    handcrafted ZB-V with zero bubble is taken without building the others.
    """
    candidates: list[_Candidate] = []
    if num_microbatches >= 2 * pp - 1:
        hand = zbv_handcrafted(pp, num_microbatches)
        if max(order_peak(hand.ranks, costs)) <= cap + 1e-9:
            candidates.append(_Candidate(hand.ranks, *_score(hand, costs)))
    if not (candidates and candidates[0].bubble <= 1e-9):  # nothing beats zero bubble
        work = _rank_work(pp, 2, Placement.V, costs)
        candidates += _engine_candidates(pp, num_microbatches, 2, Placement.V, costs, cap,
                                         intervals=(0.0, work / 2, 2 * work / 3),
                                         w_after_b=(False,))
        if cap < 2 * pp * costs.mem_f - 1e-9:
            candidates += _paced_candidates(pp, num_microbatches, costs, cap)
            candidates += _unreserved_candidates(pp, num_microbatches, costs, cap, work / 2)
        block = _block_candidate(pp, num_microbatches, costs, cap)
        if block is not None:
            candidates.append(block)
    schedule = _pick(name, pp, num_microbatches, 2, Placement.V, costs, cap, candidates)
    schedule.meta["memory_unit"] = "V chunk (half of a rank's layers)"
    return schedule
