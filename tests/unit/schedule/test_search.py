"""ZB-auto search: validity, memory limit, never worse than 1F1B/ZB-H1, lower bounds,
objectives, determinism."""

from __future__ import annotations

import random

import pytest

from odc_pp.schedule import ActionKind, CostModel
from odc_pp.schedule.generators.search import (bubble_lower_bound, default_memory_limit,
                                               makespan_lower_bound, stage_span_lower_bound,
                                               zb_auto)
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
    for objective, value in (("makespan", lambda r: r.makespan),
                             ("span", lambda r: r.max_stage_span)):
        schedule = zb_auto(pp=pp, num_microbatches=m, costs=costs, memory_limit=limit,
                           objective=objective, max_evaluations=150)
        result = simulate(schedule, costs, memory_limit=limit)
        assert result.fits_memory, result.peak_activation
        for baseline in (one_f_one_b(pp, m), _zb_h1_by_hand(pp, m)):
            base = simulate(baseline, costs, memory_limit=limit)
            assert base.fits_memory
            assert value(result) <= value(base) + 1e-9, (baseline.name, objective)
        bound = (makespan_lower_bound if objective == "makespan" else
                 stage_span_lower_bound)(pp, m, costs, memory_limit=limit)
        assert schedule.meta["lower_bound"] == pytest.approx(bound)
        assert bound <= value(result) + 1e-9
        assert schedule.meta["value"] == pytest.approx(value(result))


@pytest.mark.parametrize("pp,m,limit", [(4, 16, 4), (4, 16, 6), (6, 12, 3), (3, 9, 1)])
def test_search_respects_memory_limit_and_produces_a_complete_schedule(pp, m, limit):
    costs = CostModel(t_f=1, t_b=1, t_w=0.6)
    schedule = zb_auto(pp=pp, num_microbatches=m, costs=costs, memory_limit=limit,
                       max_evaluations=100)
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
    schedule = zb_auto(pp=pp, num_microbatches=m, costs=costs, memory_limit=2 * pp,
                       objective="makespan")
    assert simulate(schedule, costs).makespan == pytest.approx(bound)
    assert bubble_lower_bound(pp, m, costs, 2 * pp, objective="makespan") == pytest.approx(
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
    found = simulate(zb_auto(pp=2, num_microbatches=2, costs=costs, memory_limit=4,
                             objective="makespan"), costs)
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
                       max_evaluations=100)
    validate(schedule, costs, memory_limit=2 * pp)
    found = simulate(schedule, costs).max_stage_span
    for name in ("zb-h1", "1f1b", "zb-h2"):
        base = generate(name, pp=pp, num_microbatches=m, costs=costs)
        assert found <= simulate(base, costs).max_stage_span + 1e-9, name
    via_generate = generate("zb-auto", pp=pp, num_microbatches=m, costs=costs,
                            memory_limit=2 * pp, max_evaluations=100)
    assert via_generate.digest() == schedule.digest()


def _exhaustive_best_span(pp, m, costs, limit):
    """Smallest longest per-rank span over every dependency-respecting pair of orders."""
    import itertools
    from odc_pp.schedule import Action, Schedule
    from odc_pp.schedule.simulator import DeadlockError
    ops = [(k, i) for k in (ActionKind.F, ActionKind.B, ActionKind.W) for i in range(m)]

    def valid(order):
        pos = {op: n for n, op in enumerate(order)}
        return all(pos[(ActionKind.F, i)] < pos[(ActionKind.B, i)] < pos[(ActionKind.W, i)]
                   for i in range(m))
    orders = [o for o in itertools.permutations(ops) if valid(o)]
    best = float("inf")
    for first in orders:
        for second in orders:
            schedule = Schedule(name="x", pp=pp, num_microbatches=m)
            for rank, order in enumerate((first, second)):
                schedule.extend(Action(rank=rank, kind=k, microbatch=i) for k, i in order)
            try:
                result = simulate(schedule, costs, memory_limit=limit)
            except DeadlockError:
                continue
            if result.fits_memory:
                best = min(best, result.max_stage_span)
    return best


@pytest.mark.parametrize("costs,limit", [
    (CostModel(t_f=[1, 2], t_b=[1.5, 1], t_w=[0.5, 1]), None),
    (CostModel(t_f=1, t_b=1, t_w=0.4, t_comm=0.3), 1.0),
    (CostModel(t_f=1, t_b=1, t_w=0.4, t_comm=0.3, mem_b=-0.6, mem_w=-0.4), 1.5),
])
def test_span_bound_is_below_the_exhaustive_optimum_and_the_search_reaches_it(costs, limit):
    best = _exhaustive_best_span(2, 2, costs, limit)
    assert stage_span_lower_bound(2, 2, costs, memory_limit=limit) <= best + 1e-9
    found = zb_auto(pp=2, num_microbatches=2, costs=costs,
                    memory_limit=4 if limit is None else limit)
    assert simulate(found, costs).max_stage_span == pytest.approx(best)


@pytest.mark.parametrize("pp,m", [(2, 4), (4, 8), (4, 11), (6, 12), (8, 16)])
def test_equal_costs_2p_limit_give_zero_bubble_for_m_at_least_2p(pp, m):
    """The span objective's headline: ZB-auto at its default 2p limit has no bubble at
    equal costs (the makespan objective stops at ZB-H1's bubble here)."""
    costs = CostModel()
    assert stage_span_lower_bound(pp, m, costs, 2 * pp) == pytest.approx(3 * m)
    result = simulate(zb_auto(pp=pp, num_microbatches=m, costs=costs), costs)
    assert result.bubble_rate == pytest.approx(0.0, abs=1e-12)
    assert max(result.peak_activation) <= 2 * pp


def test_span_bound_tracks_memory_and_latency():
    costs = CostModel(t_comm=0.5)
    tight = stage_span_lower_bound(4, 16, costs, memory_limit=4)
    loose = stage_span_lower_bound(4, 16, costs, memory_limit=8)
    assert tight > loose >= 48
    # 1F1B budget at equal costs: the head idles (p - 1) (B + 2c) - ... at least p - 1
    assert stage_span_lower_bound(4, 16, CostModel(), memory_limit=4) == pytest.approx(48 + 3)
    with pytest.raises(ValueError, match="objective"):
        zb_auto(pp=2, num_microbatches=4, objective="latency")
    with pytest.raises(ValueError, match="max_evaluations"):
        zb_auto(pp=2, num_microbatches=4, max_evaluations=0)


def test_search_is_deterministic_under_cpu_load_and_thread_timing():
    """Every rank searches on its own: the schedule may depend only on the input, never
    on how fast the machine runs (a digest mismatch would stop training)."""
    import subprocess
    import sys
    import threading
    from concurrent.futures import ThreadPoolExecutor

    rng = random.Random(7)
    costs = _random_costs(rng, 4, comm=0.05)

    def search() -> str:
        return zb_auto(pp=4, num_microbatches=10, costs=costs, max_evaluations=60).digest()

    quiet = search()
    stop = threading.Event()

    def spin() -> None:  # competes for the GIL: other threads' timing changes
        while not stop.is_set():
            sum(i * i for i in range(2000))
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    spinners = [threading.Thread(target=spin) for _ in range(2)]
    try:
        for thread in spinners:
            thread.start()
        with ThreadPoolExecutor(max_workers=3) as pool:
            loaded = list(pool.map(lambda _: search(), range(3)))
    finally:
        stop.set()
        burner.kill()
        burner.wait(timeout=10)
        for thread in spinners:
            thread.join(timeout=10)
    assert loaded == [quiet] * 3
