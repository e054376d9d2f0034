"""odc_pp.schedule.steady_state: consecutive iterations under post-validation. A repeated
schedule keeps each copy's dependencies; a 1F1B pipeline (the last rank to finish is the
first to start) repeats at its makespan; ZB-2p's fill and drain overlap across iterations,
so its period is below one iteration's makespan and at least the busiest rank's work."""

from __future__ import annotations

import pytest

from odc_pp.schedule import CostModel
from odc_pp.schedule.generators import generate
from odc_pp.schedule.lowering import lower
from odc_pp.schedule.simulator import simulate
from odc_pp.schedule.steady_state import repeat, steady_period

COSTS = CostModel(t_f=1.0, t_b=1.2, t_w=0.8, t_comm=0.05, mem_f=1.0, mem_b=-0.5, mem_w=-0.5)


def test_repeat_renumbers_each_copy_and_keeps_the_order():
    schedule = generate("zb-h1", pp=3, num_microbatches=4, costs=COSTS)
    twice = repeat(schedule, 2)
    assert twice.num_microbatches == 8
    for rank, actions in enumerate(twice.ranks):
        first, second = actions[:len(actions) // 2], actions[len(actions) // 2:]
        assert first == schedule.ranks[rank]
        assert [a.microbatch - 4 for a in second] == [a.microbatch for a in first]
    with pytest.raises(ValueError, match="iterations"):
        repeat(schedule, 0)


def test_1f1b_repeats_at_its_makespan():
    schedule = generate("1f1b", pp=4, num_microbatches=8, costs=COSTS)
    assert steady_period(schedule, COSTS) == pytest.approx(simulate(schedule, COSTS).makespan)


@pytest.mark.parametrize("lowered", [False, True])
def test_zb_2p_iterations_overlap(lowered):
    pp, m = 4, 8
    schedule = generate("zb-auto", pp=pp, num_microbatches=m, costs=COSTS,
                        memory_limit=2.0 * pp)
    if lowered:  # explicit SEND/RECV and POST_VALIDATION, as the runtime executes it
        schedule = lower(schedule, COSTS, post_validation=True)
    sim = simulate(schedule, COSTS)
    period = steady_period(schedule, COSTS, iterations=3)
    assert max(sim.busy) - 1e-9 <= period < sim.makespan - 0.5
    assert period == pytest.approx(steady_period(schedule, COSTS, iterations=5))
