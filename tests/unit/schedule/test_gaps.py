"""Gap filling (``generators.gaps``): W's moved later into idle gaps, within memory."""

from collections import Counter

import pytest

from odc_pp.schedule.costs import CostModel
from odc_pp.schedule.generators import generate
from odc_pp.schedule.generators.gaps import fill_gaps, split_fused
from odc_pp.schedule.ir import ActionKind
from odc_pp.schedule.lowering import lower
from odc_pp.schedule.simulator import simulate
from odc_pp.schedule.validate import peak_memory, validate

# Measured on this machine by benchmarks/bench_runtime.py at seq 2048 (per virtual stage,
# seconds; the W share of a microbatch's activations from the runtime's byte counts).
SEQ2048 = CostModel(t_f=[0.1462, 0.1485, 0.1448, 0.1519], t_b=[0.2554, 0.2537, 0.2490, 0.2595],
                    t_w=[0.0390, 0.0389, 0.0386, 0.0409], t_comm=0.0008, mem_f=1.0,
                    mem_b=-2 / 3, mem_w=-1 / 3)


def _makespan(schedule, costs):
    return simulate(lower(schedule, costs), costs).makespan


def _w_order(schedule):
    """Per (rank, chunk): its W microbatches in execution order (BW counts as a W)."""
    out = {}
    for rank, actions in enumerate(schedule.ranks):
        for a in actions:
            if a.kind in (ActionKind.W, ActionKind.BW):
                out.setdefault((rank, a.chunk), []).append(a.microbatch)
    return out


@pytest.mark.parametrize("name,pp", [("interleaved", 2), ("1f1b", 4), ("zb-h1", 4)])
def test_filling_shortens_fixed_patterns_at_measured_costs_without_more_memory(name, pp):
    """(Four stages each: the costs are per virtual stage.)"""
    plain = generate(name, pp=pp, num_microbatches=8, costs=SEQ2048)
    filled = generate(name, pp=pp, num_microbatches=8, costs=SEQ2048, fill_gaps=3000)
    assert filled.meta["gap_fill"]["moves"] > 0
    assert _makespan(filled, SEQ2048) < _makespan(plain, SEQ2048) * 0.99
    assert max(peak_memory(filled, SEQ2048)) <= max(peak_memory(plain, SEQ2048)) + 1e-9
    validate(lower(filled, SEQ2048), SEQ2048)


def test_interleaved_filled_beats_the_split_zero_bubble_order_of_pytorch():
    """PyTorch's ScheduleInterleavedZeroBubble order at pp=2, m=8 (its pipeline_order,
    compute only) against our interleaved with its gaps filled, same measured costs."""
    from odc_pp.schedule.ir import Placement, Schedule
    torch_order = (
        "0F0,0F1,2F0,2F1,2I0,2W0,0F2,2I1,2W1,0F3,0I0,0W0,2F2,0I1,0W1,2F3,2I2,2W2,0F4,2I3,"
        "2W3,0F5,0I2,0W2,2F4,0I3,0W3,2F5,2I4,2W4,0F6,2I5,2W5,0F7,0I4,0W4,2F6,0I5,0W5,2F7,"
        "2I6,2W6,2I7,2W7,0I6,0W6,0I7,0W7\n"
        "1F0,1F1,3F0,3I0,3F1,3I1,3W0,1F2,1I0,3W1,1F3,1I1,1W0,3F2,3I2,1W1,3F3,3I3,3W2,1F4,"
        "1I2,3W3,1F5,1I3,1W2,3F4,3I4,1W3,3F5,3I5,3W4,1F6,1I4,3W5,1F7,1I5,1W4,3F6,3I6,1W5,"
        "3F7,3I7,3W6,1I6,3W7,1I7,1W6,1W7\n")
    theirs = Schedule.from_pipelining_csv(torch_order, name="torch-izb", num_chunks=2,
                                          placement=Placement.INTERLEAVED)
    filled = generate("interleaved", pp=2, num_microbatches=8, costs=SEQ2048,
                      fill_gaps=3000)
    assert _makespan(filled, SEQ2048) < _makespan(theirs, SEQ2048) * 0.98


def test_zbv_at_its_cap_is_never_longer_and_stays_within_it():
    plain = generate("zbv", pp=2, num_microbatches=8, costs=SEQ2048)
    filled = generate("zbv", pp=2, num_microbatches=8, costs=SEQ2048, fill_gaps=3000)
    assert _makespan(filled, SEQ2048) <= _makespan(plain, SEQ2048) + 1e-12
    assert max(peak_memory(filled, SEQ2048)) <= 4 + 1e-9  # ZB-V's 2 pp units


def test_actions_and_each_chunks_w_order_are_kept():
    plain = generate("interleaved", pp=2, num_microbatches=8, costs=SEQ2048)
    filled = generate("interleaved", pp=2, num_microbatches=8, costs=SEQ2048,
                      fill_gaps=3000)
    split = plain.copy(ranks=split_fused(plain))
    for mine, reference in zip(filled.ranks, split.ranks):
        assert Counter(mine) == Counter(reference)
        forward_and_b = [a for a in mine if a.kind is not ActionKind.W]
        assert forward_and_b == [a for a in reference if a.kind is not ActionKind.W]
    assert _w_order(filled) == _w_order(plain)


def test_the_fill_respects_a_tight_memory_limit():
    """Where W holds all of a microbatch's activations (mem_b = 0), the fixed pattern's
    own peak leaves no room to postpone a W past another forward."""
    costs = CostModel(t_f=SEQ2048.t_f, t_b=SEQ2048.t_b, t_w=SEQ2048.t_w)
    plain = generate("interleaved", pp=2, num_microbatches=8, costs=costs)
    limit = max(peak_memory(plain, costs))
    filled = fill_gaps(plain, costs, memory_limit=limit, max_evaluations=3000)
    assert max(peak_memory(filled, costs)) <= limit + 1e-9
    with pytest.raises(ValueError, match="exceeds memory_limit"):
        fill_gaps(plain, costs, memory_limit=limit - 1)


def test_uniform_costs_leave_the_zero_bubble_patterns_alone():
    for name in ("zbv", "zb-h1"):
        plain = generate(name, pp=4, num_microbatches=8)
        filled = generate(name, pp=4, num_microbatches=8, fill_gaps=500)
        assert filled.ranks == split_fused(plain)
        assert filled.meta["gap_fill"]["moves"] == 0


def test_deterministic_and_bounded():
    first = generate("1f1b", pp=4, num_microbatches=8, costs=SEQ2048, fill_gaps=50)
    again = generate("1f1b", pp=4, num_microbatches=8, costs=SEQ2048, fill_gaps=50)
    assert first.digest() == again.digest()
    assert first.meta["gap_fill"]["evaluations"] <= 50


def test_the_offloading_family_rejects_it():
    with pytest.raises(ValueError, match="does not take fill_gaps"):
        generate("offload", pp=2, num_microbatches=4, fill_gaps=10)
