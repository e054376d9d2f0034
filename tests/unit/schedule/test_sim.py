"""Simulator against closed forms and hand-made schedules."""

from __future__ import annotations


import pytest

from odc_pp.schedule import Action, ActionKind, CostModel, Schedule
from odc_pp.schedule.simulator import DeadlockError, DependencyError, simulate

A = ActionKind


@pytest.mark.parametrize("pp,m", [(1, 3), (2, 2), (3, 5), (4, 8), (4, 16), (6, 6)])
@pytest.mark.parametrize("t_f,t_b,t_w", [(1, 1, 1), (1, 2, 1), (2, 1, 0.5)])
def test_1f1b_makespan_and_bubble_match_closed_form(one_f_one_b, pp, m, t_f, t_b, t_w):
    # fused BW: every rank alternates F and BW; the pipeline fill and drain cost
    # (pp - 1) * (t_f + t_b + t_w) once, so makespan = (m + pp - 1) * (t_f + t_b + t_w)
    costs = CostModel(t_f=t_f, t_b=t_b, t_w=t_w)
    result = simulate(one_f_one_b(pp, m), costs)
    per_mb = t_f + t_b + t_w
    assert result.makespan == pytest.approx((m + pp - 1) * per_mb)
    assert result.bubble_rate == pytest.approx((pp - 1) / (m + pp - 1))
    assert result.busy == pytest.approx([m * per_mb] * pp)
    # rank r holds pp - r activations at the end of its warm-up
    assert result.peak_activation == pytest.approx([min(pp - r, m) for r in range(pp)])


def test_comm_latency_adds_per_hop_and_lowered_equals_implicit(one_f_one_b, lower_hand):
    pp, m, comm = 4, 8, 0.25
    schedule = one_f_one_b(pp, m)
    costs = CostModel(t_f=1, t_b=1, t_w=1, t_comm=comm)
    implicit = simulate(schedule, costs)
    explicit = simulate(lower_hand(schedule), costs)
    assert implicit.makespan == pytest.approx(explicit.makespan)
    # latency only delays: at least one forward and one backward hop per boundary
    assert implicit.makespan >= (m + pp - 1) * 3 + 2 * (pp - 1) * comm - 1e-9
    single = simulate(one_f_one_b(pp, 1), costs)
    assert single.makespan == pytest.approx(pp * 3 + 2 * (pp - 1) * comm)
    for action, begin in implicit.start.items():
        assert explicit.start[action] == pytest.approx(begin)
    assert 0.0 <= implicit.comm_overlap < 1.0
    assert implicit.comm_overlap == pytest.approx(explicit.comm_overlap)


def test_single_microbatch_chain_is_exact():
    # F runs down 3 ranks, B back up, W after each B; one transfer costs 0.5
    schedule = Schedule(name="chain", pp=3, num_microbatches=1)
    for rank in range(3):
        schedule.extend([Action(rank=rank, kind=A.F), Action(rank=rank, kind=A.B),
                         Action(rank=rank, kind=A.W)])
    costs = CostModel(t_f=[1, 2, 3], t_b=[1, 1, 1], t_w=[0.5, 0.5, 0.5], t_comm=0.5)
    result = simulate(schedule, costs)
    f_end = [1, 1 + 0.5 + 2, 1 + 0.5 + 2 + 0.5 + 3]
    assert result.end[Action(rank=2, kind=A.F)] == pytest.approx(f_end[2])
    b2_end = f_end[2] + 1
    b0_start = b2_end + 0.5 + 1 + 0.5
    assert result.start[Action(rank=0, kind=A.B)] == pytest.approx(b0_start)
    assert result.makespan == pytest.approx(b0_start + 1 + 0.5)
    assert result.start[Action(rank=2, kind=A.W)] == pytest.approx(b2_end)


def test_cyclic_schedule_raises_deadlock_naming_actions():
    # rank 0 wants B of microbatch 0 before sending F of microbatch 1; rank 1 does
    # F1 before B0, so each waits on the other
    schedule = Schedule(name="cycle", pp=2, num_microbatches=2)
    schedule.extend([Action(rank=0, kind=A.F, microbatch=0), Action(rank=0, kind=A.BW, microbatch=0),
                     Action(rank=0, kind=A.F, microbatch=1), Action(rank=0, kind=A.BW, microbatch=1)])
    schedule.extend([Action(rank=1, kind=A.F, microbatch=1), Action(rank=1, kind=A.F, microbatch=0),
                     Action(rank=1, kind=A.BW, microbatch=0), Action(rank=1, kind=A.BW, microbatch=1)])
    with pytest.raises(DeadlockError) as info:
        simulate(schedule, CostModel())
    message = str(info.value)
    assert "rank 0 blocked at BW0.0" in message
    assert "rank 1 blocked at F0.1" in message
    assert "waiting for F0.1 (stage 0) on rank 0" in message
    assert isinstance(info.value, ValueError)


def test_missing_and_misordered_dependencies_raise():
    schedule = Schedule(name="bad", pp=2, num_microbatches=1)
    schedule.extend([Action(rank=0, kind=A.F), Action(rank=0, kind=A.BW)])
    schedule.extend([Action(rank=1, kind=A.BW)])  # F of stage 1 is missing
    with pytest.raises(DependencyError, match=r"BW0\.0 on rank 1 .* needs F0\.0 \(stage 1\)"):
        simulate(schedule, CostModel())

    order = Schedule(name="order", pp=1, num_microbatches=1)
    order.extend([Action(rank=0, kind=A.F), Action(rank=0, kind=A.W), Action(rank=0, kind=A.B)])
    with pytest.raises(DependencyError, match="comes later"):
        simulate(order, CostModel())

    twice = Schedule(name="twice", pp=1, num_microbatches=1)
    twice.extend([Action(rank=0, kind=A.F), Action(rank=0, kind=A.BW), Action(rank=0, kind=A.W)])
    with pytest.raises(DependencyError, match="W"):
        simulate(twice, CostModel())

    dup = Schedule(name="dup", pp=1, num_microbatches=1)
    dup.extend([Action(rank=0, kind=A.F), Action(rank=0, kind=A.F), Action(rank=0, kind=A.BW)])
    with pytest.raises(DependencyError, match="duplicates"):
        simulate(dup, CostModel())


def test_memory_timeline_tracks_forward_and_weight_grad():
    # one rank: F0 F1 B0 W0 B1 W1 with unit costs; memory +1 at F start, -1 at W end
    schedule = Schedule(name="mem", pp=1, num_microbatches=2)
    for kind, mb in [(A.F, 0), (A.F, 1), (A.B, 0), (A.W, 0), (A.B, 1), (A.W, 1)]:
        schedule.append(Action(rank=0, kind=kind, microbatch=mb))
    result = simulate(schedule, CostModel(t_f=1, t_b=1, t_w=1), memory_limit=1.5)
    assert result.memory_timeline[0] == [(0.0, 0.0), (0.0, 1.0), (1.0, 2.0), (4.0, 1.0),
                                         (6.0, 0.0)]
    assert result.peak_activation == [2.0]
    assert not result.fits_memory
    assert simulate(schedule, CostModel(t_f=1, t_b=1, t_w=1), memory_limit=2).fits_memory


def _offload_schedule(with_reload_early: bool) -> Schedule:
    schedule = Schedule(name="off", pp=1, num_microbatches=2)
    acts = [(A.F, 0), (A.OFFLOAD, 0), (A.F, 1)]
    acts += [(A.RELOAD, 0), (A.B, 1)] if with_reload_early else [(A.B, 1), (A.RELOAD, 0)]
    acts += [(A.W, 1), (A.B, 0), (A.W, 0)]
    for kind, mb in acts:
        schedule.append(Action(rank=0, kind=kind, microbatch=mb))
    return schedule


def test_offload_reload_overlap_and_memory():
    costs = CostModel(t_f=1, t_b=1, t_w=1, offload_bandwidth=1.0)  # transfer takes 1
    early = simulate(_offload_schedule(True), costs)
    # OFFLOAD0 runs [1, 2] during F1; RELOAD0 runs [2, 3] during B1 -> fully hidden
    assert early.offload_overlap == pytest.approx(1.0)
    assert early.makespan == pytest.approx(6.0)
    # memory: F0 +1 at 0, F1 +1 at 1, OFFLOAD -1 at 2, RELOAD +1 at 2, ...
    assert early.peak_activation == [2.0]
    late = simulate(_offload_schedule(False), costs)
    # RELOAD0 is issued after B1 ([2, 3]) and runs [3, 4] while W1 computes
    assert late.start[Action(rank=0, kind=A.RELOAD, microbatch=0)] == pytest.approx(3.0)
    assert late.start[Action(rank=0, kind=A.B, microbatch=0)] == pytest.approx(4.0)
    assert late.makespan == pytest.approx(6.0)
    slow = simulate(_offload_schedule(False), CostModel(t_f=1, t_b=1, t_w=1,
                                                         offload_bandwidth=0.5))
    # transfers take 2: OFFLOAD [1, 3], RELOAD [3, 5] -> B0 waits until 5
    assert slow.start[Action(rank=0, kind=A.B, microbatch=0)] == pytest.approx(5.0)
    assert slow.offload_overlap == pytest.approx(3 / 4)
    assert slow.peak_activation == [2.0]


def test_offload_without_reload_is_a_dependency_error():
    schedule = Schedule(name="off", pp=1, num_microbatches=1)
    schedule.extend([Action(rank=0, kind=A.F), Action(rank=0, kind=A.OFFLOAD),
                     Action(rank=0, kind=A.BW)])
    with pytest.raises(DependencyError, match="RELOAD"):
        simulate(schedule, CostModel(offload_bandwidth=1))


def test_to_dict_is_json_ready(one_f_one_b):
    import json
    result = simulate(one_f_one_b(2, 3), CostModel())
    data = json.loads(json.dumps(result.to_dict(include_actions=True)))
    assert data["makespan"] == pytest.approx(result.makespan)
    assert len(data["actions"]) == 2 * 2 * 3


def test_score_is_the_simulated_objective_with_cutoff_and_memory(one_f_one_b):
    from odc_pp.schedule.simulator import score

    schedule = one_f_one_b(4, 8, split_w=True)
    costs = CostModel(t_f=[1, 1.5, 1, 1], t_b=1.2, t_w=0.7, t_comm=0.1)
    full = simulate(schedule, costs)
    assert score(schedule, costs) == pytest.approx(full.max_stage_span)
    assert full.max_stage_span == pytest.approx(max(full.span))
    assert score(schedule, costs, objective="makespan") == pytest.approx(full.makespan)
    assert score(schedule, costs, cutoff=full.max_stage_span - 1e-6) is None
    assert score(schedule, costs, objective="makespan", cutoff=full.makespan + 1) == \
        pytest.approx(full.makespan)
    assert score(schedule, costs, memory_limit=max(full.peak_activation) - 0.5) is None
    with pytest.raises(ValueError, match="objective"):
        score(schedule, costs, objective="latency")


def test_microbatch_scale_multiplies_each_microbatchs_compute():
    """Variable-length microbatches: pp = 1 runs them back to back, so the makespan is the
    sum of the scaled costs; all-ones equals no scale."""
    from odc_pp.schedule.generators import generate

    single = generate("1f1b", pp=1, num_microbatches=3)
    scaled = simulate(single, CostModel(t_f=1, t_b=1, t_w=1, microbatch_scale=[0.5, 2, 1]))
    assert scaled.makespan == pytest.approx(3 * (0.5 + 2 + 1))
    sched = generate("zb-h1", pp=4, num_microbatches=8)
    ones = simulate(sched, CostModel(microbatch_scale=[1.0] * 8)).makespan
    assert ones == pytest.approx(simulate(sched, CostModel()).makespan)


def test_uneven_microbatches_cost_more_than_their_mean_in_a_pipeline():
    """The same total work in uneven microbatches leaves bubbles a mean cost hides."""
    from odc_pp.schedule.generators import generate

    sched = generate("1f1b", pp=4, num_microbatches=8)
    uneven = [3.0, 0.2, 0.2, 0.2, 3.0, 0.2, 0.2, 2.0]
    mean = sum(uneven) / len(uneven)
    flat = simulate(sched, CostModel(t_f=mean, t_b=mean, t_w=mean)).makespan
    real = simulate(sched, CostModel(microbatch_scale=uneven)).makespan
    assert real > flat * 1.05


def test_microbatch_scale_is_validated():
    with pytest.raises(ValueError, match="microbatch_scale"):
        CostModel(microbatch_scale=[1.0, -1.0])
    with pytest.raises(ValueError, match="microbatch 2 has none"):
        CostModel(microbatch_scale=[1.0, 1.0]).scale_of(2)


@pytest.mark.parametrize("name,communication", [("1f1b", False), ("zbv", True),
                                                ("interleaved", True), ("offload", False)])
def test_a_compiled_schedule_times_like_the_schedule_under_every_cost_model(name,
                                                                             communication):
    """compile_schedule once, simulate under several cost models: each result equals the
    direct simulation's, to the bit (the planner's per-replica path)."""
    from odc_pp.schedule.build import ScheduleRequest, build
    from odc_pp.schedule.simulator import compile_schedule

    request = ScheduleRequest.of(name, pp=4, num_microbatches=8, communication=communication)
    schedule = build(request, CostModel(offload_bandwidth=2.0))
    compiled = compile_schedule(schedule)
    for costs in (CostModel(t_f=1.0, t_b=2.0, t_w=1.0, t_comm=0.1, offload_bandwidth=2.0),
                  CostModel(t_f=[1.0, 1.5, 1.0, 2.0] * (schedule.num_stages // 4),
                            t_b=3.0, t_w=0.5, t_comm=0.0, offload_bandwidth=1.0,
                            microbatch_scale=[0.5 + 0.25 * i for i in range(8)])):
        direct, reused = simulate(schedule, costs), simulate(compiled, costs)
        for field in ("makespan", "busy", "span", "peak_activation", "memory_timeline",
                      "comm_overlap", "offload_overlap", "rank_starts", "rank_ends"):
            assert getattr(reused, field) == getattr(direct, field), field
