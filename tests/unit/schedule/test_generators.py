"""Generators: argument errors, property tests over random shapes/costs, closed forms.

Closed-form facts use T_F = T_B = T_W = 1, T_comm = 0 and SIM's simulator. "Bubble" is
the zero-bubble paper's: C - busy, with C the longest per-rank compute span (first
start to last end on that rank) and busy the busiest rank's compute time.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from odc_pp.schedule import ActionKind, CostModel, Placement, Schedule
from odc_pp.schedule.generators import FAMILY_NAMES, default_chunks, generate
from odc_pp.schedule.generators._block import v_block_orders, v_block_peak
from odc_pp.schedule.generators._engine import EngineConfig, EngineCutOff, run_engine
from odc_pp.schedule.lowering import lower
from odc_pp.schedule.simulator import simulate
from odc_pp.schedule.validate import peak_memory, validate

UNIT = CostModel(t_f=1, t_b=1, t_w=1, t_comm=0)
B_RELEASES = CostModel(t_f=1, t_b=1, t_w=1, t_comm=0, mem_f=1, mem_b=-1, mem_w=0)
FAMILIES = [n for n in FAMILY_NAMES if n != "zb-auto"]  # zb-auto belongs to SIM


def bubble_time(result) -> float:
    return max(result.span) - max(result.busy)


# ----- argument errors ----------------------------------------------------------------
def test_names_and_default_chunks():
    assert FAMILY_NAMES == ("1f1b", "interleaved", "gis", "zb-h1", "zb-h2", "zb-auto", "zbv",
                            "v-half", "v-min", "offload", "dualpipev")
    assert [default_chunks(n) for n in FAMILY_NAMES] == [1, 2, 2, 1, 1, 1, 2, 2, 2, 2, 2]
    for name in FAMILIES:
        costs = CostModel(offload_bandwidth=1.0)
        schedule = generate(name, pp=2, num_microbatches=4, costs=costs)
        assert schedule.num_chunks == default_chunks(name)
        assert schedule.name == name
        assert all(a.is_compute for a in schedule.actions())
        expected = Placement.V if name in ("zbv", "v-half", "v-min", "dualpipev") \
            else Placement.INTERLEAVED
        assert schedule.placement is expected


@pytest.mark.parametrize("kwargs, words", [
    (dict(name="gpipe", pp=2, num_microbatches=4), ["unknown schedule", "1f1b", "dualpipev"]),
    (dict(name="1f1b", pp=0, num_microbatches=4), ["pp must be", ">= 1"]),
    (dict(name="1f1b", pp=2, num_microbatches=0), ["num_microbatches"]),
    (dict(name="1f1b", pp=2, num_microbatches=4, num_chunks=2), ["one model chunk",
                                                               "interleaved"]),
    (dict(name="zb-h1", pp=2, num_microbatches=4, num_chunks=3), ["num_chunks=3"]),
    (dict(name="zbv", pp=2, num_microbatches=4, num_chunks=3), ["exactly 2", "2 * pp"]),
    (dict(name="v-min", pp=2, num_microbatches=4, num_chunks=1), ["exactly 2"]),
    (dict(name="dualpipev", pp=2, num_microbatches=4, num_chunks=4), ["exactly 2"]),
    (dict(name="interleaved", pp=2, num_microbatches=4, num_chunks=1), ["num_chunks >= 2"]),
    (dict(name="interleaved", pp=4, num_microbatches=3), ["num_microbatches >= pp (4)"]),
    (dict(name="interleaved", pp=4, num_microbatches=8, group_size=2), ["group_size",
                                                                        ">= pp"]),
    (dict(name="dualpipev", pp=4, num_microbatches=7), ["num_microbatches >= 2 * pp (8)"]),
    (dict(name="1f1b", pp=4, num_microbatches=8, memory_limit=3), ["needs 4",
                                                                   "memory_limit 3"]),
    (dict(name="zb-h1", pp=4, num_microbatches=8, memory_limit=2), ["memory_limit 2",
                                                                    "v-min"]),
    (dict(name="v-min", pp=4, num_microbatches=8, memory_limit=1.5), ["below 2",
                                                                      "raise memory_limit"]),
    (dict(name="zb-h2", pp=4, num_microbatches=8, memory_limit=0.5), ["below 1"]),
    (dict(name="zbv", pp=4, num_microbatches=8, foo=1), ["does not take", "foo"]),
    (dict(name="offload", pp=2, num_microbatches=4), ["offload_bandwidth"]),
])
def test_clear_value_errors(kwargs, words):
    name = kwargs.pop("name")
    with pytest.raises(ValueError) as info:
        generate(name, **kwargs)
    for word in words:
        assert word in str(info.value), str(info.value)


def test_cost_model_with_allocating_backward_is_rejected():
    with pytest.raises(ValueError, match="mem_b <= 0"):
        generate("zb-h2", pp=2, num_microbatches=4,
                 costs=CostModel(mem_f=1, mem_b=0.5, mem_w=-1.5))


def test_offload_limit_below_everything_offloaded():
    costs = CostModel(offload_bandwidth=4.0)
    with pytest.raises(ValueError, match="every chunk offloaded"):
        generate("offload", pp=4, num_microbatches=8, costs=costs, memory_limit=1.0)


# ----- property tests -------------------------------------------------------------------
def _rejects(name: str, pp: int, num_microbatches: int) -> bool:
    """The shape rules each family documents."""
    if name in ("interleaved", "offload"):
        return num_microbatches < pp
    if name == "dualpipev":
        return num_microbatches < 2 * pp
    return False


positive = st.floats(min_value=0.1, max_value=3.0, allow_nan=False)


@st.composite
def cost_models(draw, pp: int):
    def times():
        if draw(st.booleans()):
            return draw(positive)
        return draw(st.lists(positive, min_size=pp, max_size=pp))

    release_on_b = draw(st.booleans())
    return CostModel(t_f=times(), t_b=times(), t_w=times(),
                     t_comm=draw(st.sampled_from([0.0, 0.05, 0.5])),
                     offload_bandwidth=draw(st.floats(min_value=0.3, max_value=5.0)),
                     mem_f=1.0, mem_b=-1.0 if release_on_b else 0.0,
                     mem_w=0.0 if release_on_b else -1.0)


@st.composite
def shapes(draw):
    pp = draw(st.integers(min_value=2, max_value=16))
    num_microbatches = draw(st.integers(min_value=1, max_value=64))
    return pp, num_microbatches, draw(cost_models(pp))


def _check_family(name: str, pp: int, num_microbatches: int, costs: CostModel,
                  memory_limit: float | None) -> None:
    if _rejects(name, pp, num_microbatches):
        with pytest.raises(ValueError, match="num_microbatches >="):
            generate(name, pp=pp, num_microbatches=num_microbatches, costs=costs,
                     memory_limit=memory_limit)
        return
    try:
        schedule = generate(name, pp=pp, num_microbatches=num_microbatches, costs=costs,
                            memory_limit=memory_limit)
    except ValueError as error:
        # only a memory limit may make a valid shape fail, and the message must say so
        assert memory_limit is not None, error
        assert "memory_limit" in str(error), error
        return
    assert (schedule.pp, schedule.num_microbatches) == (pp, num_microbatches)
    limit = schedule.meta.get("memory_limit")
    if memory_limit is not None:
        assert limit is not None and limit <= memory_limit + 1e-9
    validate(schedule, costs, memory_limit=None if name == "offload" else limit)
    lowered = lower(schedule, costs)
    validate(lowered, costs, memory_limit=memory_limit)
    if name == "offload" and limit is not None:
        assert max(peak_memory(lowered, costs)) <= limit + 1e-9


FAST = settings(max_examples=6, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.parametrize("name", ["1f1b", "interleaved", "zb-h1", "dualpipev", "offload"])
@FAST
@given(data=shapes(), limit=st.none() | st.floats(min_value=0.5, max_value=40.0))
def test_fixed_pattern_families_validate(name, data, limit):
    pp, num_microbatches, costs = data
    _check_family(name, pp, num_microbatches, costs, limit)


@pytest.mark.parametrize("name", ["zb-h2", "zbv", "v-half", "v-min"])
@FAST
@given(data=shapes(), limit=st.none() | st.floats(min_value=0.5, max_value=40.0))
def test_memory_controlled_families_validate(name, data, limit):
    pp, num_microbatches, costs = data
    _check_family(name, pp, num_microbatches, costs, limit)


@settings(max_examples=15, deadline=None)
@given(pp=st.integers(2, 6), num_microbatches=st.integers(1, 16), data=st.data())
def test_engine_timing_is_the_in_order_timing(pp, num_microbatches, data):
    """The greedy engine ranks candidates with its own clock; it must equal the
    simulator's in-order timing of the order it emits."""
    costs = data.draw(cost_models(pp))
    chunks = data.draw(st.sampled_from([1, 2]))
    placement = Placement.V if chunks == 2 else Placement.INTERLEAVED
    cap = data.draw(st.integers(2, 2 * pp)) * costs.mem_f
    result = run_engine(EngineConfig(
        pp=pp, num_microbatches=num_microbatches, num_chunks=chunks, placement=placement,
        costs=costs, caps=[cap] * pp, backward_first=data.draw(st.booleans()),
        w_after_b=data.draw(st.booleans())))
    from odc_pp.schedule import Schedule

    schedule = Schedule(name="e", pp=pp, num_microbatches=num_microbatches,
                        num_chunks=chunks, placement=placement, ranks=result.ranks)
    validate(schedule, costs, memory_limit=cap)
    sim = simulate(schedule, costs)
    assert sim.makespan == pytest.approx(result.makespan)
    assert sim.span == pytest.approx(result.span)


# ----- closed forms (T_F = T_B = T_W = 1, T_comm = 0) ----------------------------------
SHAPES = [(2, 1), (2, 4), (3, 7), (4, 4), (4, 8), (5, 12), (8, 8), (8, 24)]


@pytest.mark.parametrize("pp,num_microbatches", SHAPES)
def test_1f1b_bubble_closed_form(pp, num_microbatches):
    result = simulate(generate("1f1b", pp=pp, num_microbatches=num_microbatches), UNIT)
    assert result.bubble_rate == pytest.approx((pp - 1) / (num_microbatches + pp - 1))
    assert max(result.peak_activation) == min(pp, num_microbatches)


@pytest.mark.parametrize("pp,num_microbatches", [s for s in SHAPES if s[1] >= s[0]])
def test_zb_h1_memory_of_1f1b_third_of_its_bubble(pp, num_microbatches):
    base = simulate(generate("1f1b", pp=pp, num_microbatches=num_microbatches), UNIT)
    zb = simulate(generate("zb-h1", pp=pp, num_microbatches=num_microbatches), UNIT)
    assert max(zb.peak_activation) == max(base.peak_activation)
    assert bubble_time(base) == pytest.approx(3 * (pp - 1))
    assert bubble_time(zb) <= bubble_time(base) / 3 + 1e-9
    assert zb.bubble_rate < base.bubble_rate


@pytest.mark.parametrize("name", ["zb-h2", "zbv"])
@pytest.mark.parametrize("pp,num_microbatches", [(2, 4), (3, 6), (4, 8), (4, 11), (6, 12),
                                                 (8, 16)])
def test_zero_bubble_for_m_at_least_2p(name, pp, num_microbatches):
    result = simulate(generate(name, pp=pp, num_microbatches=num_microbatches), UNIT)
    assert result.bubble_rate == pytest.approx(0.0, abs=1e-12)
    assert bubble_time(result) == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("pp,num_microbatches", [(4, 8), (6, 12), (8, 16)])
def test_zb_h2_and_zbv_memory(pp, num_microbatches):
    one = max(simulate(generate("1f1b", pp=pp, num_microbatches=num_microbatches),
                       UNIT).peak_activation)
    h2 = simulate(generate("zb-h2", pp=pp, num_microbatches=num_microbatches), UNIT)
    assert max(h2.peak_activation) <= 2 * one
    # ZB-V counts V chunks (half a rank's layers): 1F1B's peak is 2 * one chunk units
    zbv = simulate(generate("zbv", pp=pp, num_microbatches=num_microbatches), UNIT)
    assert max(zbv.peak_activation) <= 2 * one


def _budget(name: str, pp: int) -> int:
    """The controllable-memory paper's budget in V-chunk units (two per microbatch)."""
    return 2 * {"zbv": pp, "v-half": (pp + 2) // 2, "v-min": (pp + 4) // 3}[name]


@pytest.mark.parametrize("costs", [UNIT, B_RELEASES], ids=["w-frees", "b-frees"])
@pytest.mark.parametrize("pp,num_microbatches", [(2, 4), (3, 6), (4, 8), (5, 10), (6, 12),
                                                 (9, 20)])
def test_v_families_stay_within_the_paper_budgets(costs, pp, num_microbatches):
    """Without a limit, ZB-V, V-Half and V-Min stay within pp, (pp + 2) // 2 and
    (pp + 4) // 3 microbatches of a whole rank's layers (two V-chunk units each; 1F1B's
    peak is pp whole-rank microbatches), and the peak is recorded as the limit."""
    one = max(simulate(generate("1f1b", pp=pp, num_microbatches=num_microbatches,
                                costs=costs), costs).peak_activation)
    assert one == pp
    for name in ("zbv", "v-half", "v-min"):
        schedule = generate(name, pp=pp, num_microbatches=num_microbatches, costs=costs)
        assert schedule.meta["memory_limit"] == _budget(name, pp)
        peak = max(simulate(schedule, costs).peak_activation)
        assert peak <= _budget(name, pp) + 1e-9, name


def test_interleaved_beats_1f1b_and_handles_uneven_microbatches():
    for pp, num_microbatches in [(4, 8), (4, 10), (3, 7)]:
        base = simulate(generate("1f1b", pp=pp, num_microbatches=num_microbatches), UNIT)
        vpp = generate("interleaved", pp=pp, num_microbatches=num_microbatches)
        validate(vpp)
        assert simulate(vpp, UNIT).bubble_rate < base.bubble_rate


def test_dualpipev_marks_overlapped_pairs():
    schedule = generate("dualpipev", pp=4, num_microbatches=10)
    pairs = schedule.meta["overlap_pairs"]
    assert pairs
    for rank, index in pairs:
        first, second = schedule.ranks[rank][index], schedule.ranks[rank][index + 1]
        assert first.kind.value == "F" and second.kind.value in ("BW", "B")
        assert first.chunk != second.chunk


def test_offload_meta_and_memory_limit():
    costs = CostModel(offload_bandwidth=2.0)
    free = generate("offload", pp=4, num_microbatches=8, costs=costs)
    assert free.meta["offload_chunks"] == free.meta["hidden_offload_chunks"]
    assert free.meta["offload_chunks"], "long-lived chunk-0 activations should qualify"
    assert free.meta["offload_time"] == pytest.approx(0.5)
    peak_plain = max(peak_memory(free, costs))
    limited = generate("offload", pp=4, num_microbatches=8, costs=costs,
                       memory_limit=peak_plain - 2)
    assert max(peak_memory(lower(limited, costs), costs)) <= peak_plain - 2
    slow = generate("offload", pp=4, num_microbatches=8,
                    costs=CostModel(offload_bandwidth=0.01))
    assert slow.meta["offload_chunks"] == []  # transfers could not hide


def test_generators_are_pure():
    costs = CostModel(t_f=[1, 2, 1, 1], t_b=1.5, t_w=0.5, offload_bandwidth=1.0)
    for name in FAMILIES:
        first = generate(name, pp=4, num_microbatches=8, costs=costs)
        second = generate(name, pp=4, num_microbatches=8, costs=costs)
        assert first.to_dict() == second.to_dict()


def test_zb_auto_dispatches_to_search():
    schedule = generate("zb-auto", pp=3, num_microbatches=6, max_evaluations=50)
    assert schedule.name == "zb-auto" and schedule.num_chunks == 1
    validate(schedule, memory_limit=schedule.meta["memory_limit"])
    validate(lower(schedule))
    with pytest.raises(ValueError, match="one model chunk"):
        generate("zb-auto", pp=3, num_microbatches=6, num_chunks=2)


@pytest.mark.parametrize("pp", [4, 8, 16])
@pytest.mark.parametrize("factor", [2, 4])
def test_v_min_and_v_half_beat_1f1b_at_the_paper_budgets(pp, factor):
    """Equal costs (F = B = W per V chunk; bubble rates do not depend on the time unit)
    and the default memory model (W frees): at the paper's budgets, (pp + 4) // 3 and
    (pp + 2) // 2 whole-rank microbatches, V-Min and V-Half have a smaller bubble than
    1F1B, and V-Half's is no larger than V-Min's."""
    num_microbatches = factor * pp
    base = simulate(generate("1f1b", pp=pp, num_microbatches=num_microbatches), UNIT)
    rates = {}
    for name in ("v-min", "v-half"):
        limit = _budget(name, pp)
        schedule = generate(name, pp=pp, num_microbatches=num_microbatches, costs=UNIT,
                            memory_limit=limit)
        result = simulate(schedule, UNIT, memory_limit=limit)
        assert result.fits_memory, (name, result.peak_activation)
        assert result.bubble_rate < base.bubble_rate, (name, result.bubble_rate)
        rates[name] = result.bubble_rate
    assert rates["v-half"] <= rates["v-min"] + 1e-12


@pytest.mark.parametrize("name", ["zbv", "v-half", "v-min"])
@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(pp=st.integers(2, 8), num_microbatches=st.integers(1, 24), data=st.data())
def test_v_families_build_within_any_feasible_limit(name, pp, num_microbatches, data):
    """Any limit from the minimum (one microbatch on both chunks, 2 mem_f) up, below or
    above the family's budget, gives a complete valid schedule (every F, B and W once,
    local order, progress) whose peak, as the simulator accounts it, stays within it."""
    costs = data.draw(cost_models(pp))
    limit = data.draw(st.floats(min_value=2.0, max_value=2.5 * pp + 2.0)) * costs.mem_f
    schedule = generate(name, pp=pp, num_microbatches=num_microbatches, costs=costs,
                        memory_limit=limit)
    assert schedule.meta["memory_limit"] == limit
    validate(schedule, costs, memory_limit=limit)
    result = simulate(schedule, costs, memory_limit=limit)
    assert result.fits_memory and max(result.peak_activation) <= limit + 1e-9
    assert sum(len(r) for r in schedule.ranks) == 3 * 2 * pp * num_microbatches
    validate(lower(schedule, costs), costs, memory_limit=limit)


@pytest.mark.parametrize("name", ["zbv", "v-half", "v-min"])
def test_v_limit_below_the_minimum_names_the_flag_and_the_minimum(name):
    with pytest.raises(ValueError, match=r"memory_limit \(--memory-limit\) 1\.9 is below 2, "
                                         r"the minimum of .*at least 2"):
        generate(name, pp=4, num_microbatches=8, memory_limit=1.9)


def test_list_scheduler_priorities_are_pluggable_and_caps_hold():
    from odc_pp.schedule.generators._engine import default_priority

    costs = CostModel(t_f=1, t_b=1.2, t_w=0.5, t_comm=0.1)
    base = dict(pp=4, num_microbatches=12, num_chunks=1, placement=Placement.INTERLEAVED,
                costs=costs, caps=[8.0] * 4)

    def w_right_after_b(decision):  # the same rule as the w_after_b switch
        if decision.w_queue:
            return ("W", None)
        return default_priority(decision)
    plugged = run_engine(EngineConfig(**base, priority=w_right_after_b))
    switched = run_engine(EngineConfig(**base, w_after_b=True))
    assert plugged.ranks == switched.ranks
    capped = run_engine(EngineConfig(**base, inflight=[3, 3, 2, 1], w_slack=0.5,
                                     reserve_slot=False))
    for rank, actions in enumerate(capped.ranks):
        held = 0
        for action in actions:
            held += {ActionKind.F: 1, ActionKind.B: -1}.get(action.kind, 0)
            assert held <= [3, 3, 2, 1][rank]
    from odc_pp.schedule import Schedule
    validate(Schedule(name="c", pp=4, num_microbatches=12, ranks=capped.ranks), costs)


@pytest.mark.parametrize("deltas", [(1.0, 0.0, -1.0), (1.0, -0.3, -0.7), (1.0, 0.5, -1.5)])
def test_v_block_peak_matches_the_orders(deltas):
    costs = CostModel(mem_f=deltas[0], mem_b=deltas[1], mem_w=deltas[2])
    for pp in (1, 2, 3, 4, 8):
        for m in (1, 2, 5, 17):
            for interval in (6, 7, 9, 13, 6 * pp + 6):
                fast = v_block_peak(pp, m, interval, costs)
                orders = Schedule(name="v-block", pp=pp, num_microbatches=m,
                                  ranks=v_block_orders(pp, m, interval))
                slow = peak_memory(orders, costs)
                assert fast == pytest.approx(slow, abs=1e-9), (pp, m, interval)


def test_engine_bubble_cutoff_abandons_only_worse_runs():
    base = dict(pp=4, num_microbatches=12, num_chunks=2, placement=Placement.V,
                costs=CostModel(t_f=1.0, t_b=1.3, t_w=0.7), caps=[6.0] * 4,
                inject_interval=2.0)
    full = run_engine(EngineConfig(**base))
    assert full.max_bubble > 0
    same = run_engine(EngineConfig(**base, bubble_cutoff=full.max_bubble))
    assert same.ranks == full.ranks
    with pytest.raises(EngineCutOff):
        run_engine(EngineConfig(**base, bubble_cutoff=full.max_bubble * 0.5))
    with pytest.raises(ValueError, match="bubble_cutoff"):
        EngineConfig(**base, bubble_cutoff=-1.0)


@pytest.mark.parametrize("pp,m", [(2, 3), (3, 5), (4, 8), (5, 13)])
@pytest.mark.parametrize("deltas", [(1.0, 0.0, -1.0), (1.0, -0.6, -0.4), (1.0, 0.5, -1.5)])
def test_zbv_handcrafted_fits_is_its_order_peak(pp, m, deltas):
    """The streamed peak check of the handcrafted ZB-V pattern decides exactly as the peak
    of the built orders, at the peak itself and just below it."""
    from odc_pp.schedule.generators.classic import zbv_handcrafted, zbv_handcrafted_fits

    costs = CostModel(mem_f=deltas[0], mem_b=deltas[1], mem_w=deltas[2])
    peak = max(peak_memory(zbv_handcrafted(pp, m), costs))
    assert zbv_handcrafted_fits(pp, m, costs.memory_delta, peak)
    assert not zbv_handcrafted_fits(pp, m, costs.memory_delta, peak - 0.25)
