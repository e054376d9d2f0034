"""ZB-auto search: validity, memory limit, never worse than 1F1B/ZB-H1, lower bound."""

from __future__ import annotations

import random

import pytest

from odc_pp.schedule import ActionKind, CostModel
from odc_pp.schedule.search import (bubble_lower_bound, default_memory_limit,
                                    makespan_lower_bound, zb_auto)
from odc_pp.schedule.simulator import simulate


def _random_costs(rng: random.Random, pp: int, comm: float) -> CostModel:
    t_f = [rng.uniform(0.5, 2.0) for _ in range(pp)]
    t_b = [f * rng.uniform(0.8, 1.6) for f in t_f]
    t_w = [b * rng.uniform(0.3, 1.0) for b in t_b]
    return CostModel(t_f=t_f, t_b=t_b, t_w=t_w, t_comm=comm)


def _zb_h1_by_hand(pp: int, m: int):
    """ZB-H1 pattern: 1F1B warm-up, then F,B pairs; rank r defers up to r W passes
    (peak activation pp on every rank)."""
    from odc_pp.schedule import Action, Schedule
    schedule = Schedule(name="zb-h1-hand", pp=pp, num_microbatches=m)
    A = ActionKind
    for rank in range(pp):
        warmup = min(pp - rank - 1, m)
        order = [(A.F, i) for i in range(warmup)]
        next_f, next_b, next_w = warmup, 0, 0
        while next_b < m:
            if next_f < m:
                order.append((A.F, next_f))
                next_f += 1
            order.append((A.B, next_b))
            next_b += 1
            if next_b - next_w > rank or next_f >= m:
                order.append((A.W, next_w))
                next_w += 1
        order += [(A.W, i) for i in range(next_w, m)]
        schedule.extend(Action(rank=rank, kind=k, microbatch=mb) for k, mb in order)
    return schedule


@pytest.mark.parametrize("seed", range(6))
def test_search_beats_1f1b_and_zbh1_on_random_heterogeneous_costs(seed, one_f_one_b):
    rng = random.Random(seed)
    pp = rng.choice([2, 3, 4, 6])
    m = rng.choice([pp, 2 * pp, 3 * pp])
    costs = _random_costs(rng, pp, comm=rng.choice([0.0, 0.1]))
    limit = float(pp)  # the 1F1B budget: both baselines fit
    schedule = zb_auto(pp=pp, num_microbatches=m, costs=costs, memory_limit=limit,
                       time_budget_s=0.3)
    result = simulate(schedule, costs, memory_limit=limit)
    assert result.fits_memory, result.peak_activation
    for baseline in (one_f_one_b(pp, m), _zb_h1_by_hand(pp, m)):
        base = simulate(baseline, costs, memory_limit=limit)
        assert base.fits_memory
        assert result.makespan <= base.makespan + 1e-9, baseline.name
    bound = makespan_lower_bound(pp, m, costs, memory_limit=limit)
    assert schedule.meta["lower_bound"] == pytest.approx(bound)
    assert bound <= result.makespan + 1e-9
    assert schedule.meta["makespan"] == pytest.approx(result.makespan)


@pytest.mark.parametrize("pp,m,limit", [(4, 16, 4), (4, 16, 6), (6, 12, 3), (3, 9, 1)])
def test_search_respects_memory_limit_and_produces_a_complete_schedule(pp, m, limit):
    costs = CostModel(t_f=1, t_b=1, t_w=0.6)
    schedule = zb_auto(pp=pp, num_microbatches=m, costs=costs, memory_limit=limit,
                       time_budget_s=0.3)
    result = simulate(schedule, costs, memory_limit=limit)
    assert result.fits_memory and max(result.peak_activation) <= limit
    assert schedule.name == "zb-auto" and schedule.num_chunks == 1
    for rank in range(pp):
        kinds = [a.kind for a in schedule.ranks[rank]]
        for kind in (ActionKind.F, ActionKind.B, ActionKind.W):
            assert kinds.count(kind) == m
    assert "search_seconds" in schedule.meta


def test_uniform_costs_reach_the_bound_with_twice_1f1b_memory():
    # F = B = 1, W = 0.6, memory 2p: the bound is m*(F+B+W) + (p-1)*F and is attained
    pp, m = 4, 16
    costs = CostModel(t_f=1, t_b=1, t_w=0.6)
    bound = makespan_lower_bound(pp, m, costs, memory_limit=2 * pp)
    assert bound == pytest.approx(m * 2.6 + (pp - 1))
    schedule = zb_auto(pp=pp, num_microbatches=m, costs=costs, memory_limit=2 * pp)
    assert simulate(schedule, costs).makespan == pytest.approx(bound)
    assert bubble_lower_bound(pp, m, costs, 2 * pp) == pytest.approx(
        (pp - 1) / (m * 2.6 + pp - 1))


def test_lower_bound_is_below_exhaustive_optimum_for_a_tiny_case():
    # pp=2, m=2: enumerate every per-rank order consistent with dependencies
    import itertools
    from odc_pp.schedule import Action, Schedule
    from odc_pp.schedule.simulator import DeadlockError
    costs = CostModel(t_f=[1, 2], t_b=[1.5, 1], t_w=[0.5, 1])
    ops = [(k, i) for k in (ActionKind.F, ActionKind.B, ActionKind.W) for i in range(2)]

    def valid(order):
        pos = {op: n for n, op in enumerate(order)}
        return all(pos[(ActionKind.F, i)] < pos[(ActionKind.B, i)] < pos[(ActionKind.W, i)]
                   for i in range(2))
    orders = [o for o in itertools.permutations(ops) if valid(o)]
    best = float("inf")
    for first in orders:
        for second in orders:
            schedule = Schedule(name="x", pp=2, num_microbatches=2)
            for rank, order in enumerate((first, second)):
                schedule.extend(Action(rank=rank, kind=k, microbatch=i) for k, i in order)
            try:
                best = min(best, simulate(schedule, costs).makespan)
            except DeadlockError:
                continue
    bound = makespan_lower_bound(2, 2, costs)
    assert bound <= best + 1e-9
    found = simulate(zb_auto(pp=2, num_microbatches=2, costs=costs, memory_limit=4), costs)
    assert found.makespan == pytest.approx(best)


def test_default_memory_limit_and_bad_input():
    assert default_memory_limit(8, CostModel()) == 16
    with pytest.raises(ValueError, match="memory"):
        zb_auto(pp=4, num_microbatches=8, costs=CostModel(), memory_limit=0.5)
    with pytest.raises(ValueError, match="num_microbatches"):
        zb_auto(pp=4, num_microbatches=0, costs=CostModel())


def test_search_output_passes_the_generators_validator_and_beats_their_baselines():
    from odc_pp.schedule.generators import generate
    from odc_pp.schedule.validate import validate
    pp, m = 4, 12
    costs = CostModel(t_f=[1.5, 1, 1, 1.5], t_b=[1.5, 1, 1, 1.5], t_w=[0.9, 0.6, 0.6, 0.9],
                      t_comm=0.05)
    schedule = zb_auto(pp=pp, num_microbatches=m, costs=costs, memory_limit=2 * pp,
                       time_budget_s=0.3)
    validate(schedule, costs, memory_limit=2 * pp)
    found = simulate(schedule, costs).makespan
    for name in ("zb-h1", "1f1b"):
        base = generate(name, pp=pp, num_microbatches=m, costs=costs)
        assert found <= simulate(base, costs).makespan + 1e-9, name
    via_generate = generate("zb-auto", pp=pp, num_microbatches=m, costs=costs,
                            memory_limit=2 * pp, time_budget_s=0.3)
    assert simulate(via_generate, costs).makespan == pytest.approx(found)


def test_baseline_patterns_are_the_generators_zb_h1_and_1f1b():
    """zb-auto's 'never worse than ZB-H1 / 1F1B' rests on its own copies of their orders
    (search imports nothing from the generators): they must stay the generators' orders."""
    from odc_pp.schedule.generators import generate
    from odc_pp.schedule.search import _B, _F, _W, _pattern_orders

    letters = {ActionKind.F: [_F], ActionKind.B: [_B], ActionKind.W: [_W],
               ActionKind.BW: [_B, _W]}
    for pp in range(1, 7):
        for m in range(1, 17):
            for name, extra in (("zb-h1", (0, 0)), ("1f1b", (0, -pp))):
                schedule = generate(name, pp=pp, num_microbatches=m)
                orders = [[(k, a.microbatch) for a in schedule.compute_actions(r)
                           for k in letters[a.kind]] for r in range(pp)]
                assert orders == _pattern_orders(pp, m, *extra), (name, pp, m)
