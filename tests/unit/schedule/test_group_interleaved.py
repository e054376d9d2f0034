"""PipeOffload's schedules (arXiv 2503.01328): group-interleaved 1F1B (GIS) with any group
size 1..pp, and selective offload per (chunk, microbatch) pass (PO-H, PO-F)."""

from __future__ import annotations

import pytest

from odc_pp.schedule.build import ScheduleRequest, build
from odc_pp.schedule.costs import CostModel
from odc_pp.schedule.generators import generate
from odc_pp.schedule.lowering import insert_offload, lower
from odc_pp.schedule.simulator import simulate
from odc_pp.schedule.validate import validate

COSTS = CostModel(t_f=1.0, t_b=1.0, t_w=1.0)


@pytest.mark.parametrize("pp", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("chunks", [2, 3])
def test_every_group_size_validates_lowered_and_simulates(pp, chunks):
    for group_size in range(1, pp + 1):
        for microbatches in (pp, 2 * pp + 1, 3 * pp):
            schedule = generate("gis", pp=pp, num_microbatches=microbatches,
                                num_chunks=chunks, group_size=group_size)
            validate(schedule)
            lowered = lower(schedule, CostModel(t_comm=0.3))
            validate(lowered)
            assert simulate(lowered, CostModel(t_comm=0.3)).makespan > 0


@pytest.mark.parametrize("pp,microbatches", [(4, 8), (4, 16), (8, 32)])
def test_gis_below_pp_holds_less_than_megatron_interleaved_at_its_speed(pp, microbatches):
    megatron = simulate(generate("interleaved", pp=pp, num_microbatches=microbatches), COSTS)
    for group_size in range((pp + 1) // 2, pp):
        gis = simulate(generate("gis", pp=pp, num_microbatches=microbatches,
                                group_size=group_size), COSTS)
        assert max(gis.peak_activation) < max(megatron.peak_activation), group_size
        assert gis.makespan <= megatron.makespan * 1.01, group_size


def test_smaller_groups_hold_fewer_microbatches():
    peaks = [max(simulate(generate("gis", pp=8, num_microbatches=32, group_size=g),
                          COSTS).peak_activation) for g in (4, 5, 6, 7, 8)]
    assert peaks == sorted(peaks) and peaks[0] < peaks[-1], peaks


def test_group_size_out_of_range_names_the_range():
    with pytest.raises(ValueError, match=r"1\.\.pp \(4\)"):
        generate("gis", pp=4, num_microbatches=8, group_size=5)
    with pytest.raises(ValueError, match="gis schedule takes 1..pp"):
        generate("interleaved", pp=4, num_microbatches=8, group_size=2)


@pytest.mark.parametrize("bandwidth", [0.5, 1.0])
def test_selective_offload_lowers_the_peak_and_hides_every_transfer(bandwidth):
    costs = CostModel(offload_bandwidth=bandwidth)
    compute = generate("offload", pp=4, num_microbatches=16, costs=costs, group_size=1)
    plain = simulate(compute, costs)
    full = simulate(insert_offload(compute, costs, [0, 1]), costs)
    selective = insert_offload(compute, costs, [0, 1], selective=True)
    validate(selective, costs)
    chosen = simulate(selective, costs)
    assert max(chosen.peak_activation) < max(plain.peak_activation)
    assert chosen.makespan <= plain.makespan + 1e-9  # the hidden-transfer bound
    assert full.makespan > plain.makespan  # offloading every pass shows on this link
    skipped = selective.meta["offload_skipped"]
    assert 0 < len(skipped) < 4 * 16 * 2


def test_po_h_offloads_about_half_and_po_f_more():
    costs = CostModel(offload_bandwidth=2.0)
    compute = generate("offload", pp=4, num_microbatches=16, costs=costs, group_size=1)
    count = {}
    for label, chunks in (("h", [0]), ("f", [0, 1])):
        lowered = insert_offload(compute, costs, chunks, selective=True)
        count[label] = sum(a.kind.value == "OFFLOAD" for a in lowered.actions())
    total = 4 * 16 * 2
    assert 0.3 * total <= count["h"] <= 0.5 * total < count["f"], count


def test_request_carries_group_size_and_selective_offload():
    request = ScheduleRequest.of("offload", pp=4, num_microbatches=8, group_size=1,
                                 offload_chunks=[0, 1], selective_offload=True)
    schedule = build(request, CostModel(offload_bandwidth=1.0))
    validate(schedule)
    assert schedule.meta["group_size"] == 1 and "offload_skipped" in schedule.meta
    with pytest.raises(ValueError, match="grouped schedule"):
        ScheduleRequest.of("zbv", pp=4, num_microbatches=8, group_size=2)


@pytest.mark.parametrize("pp", [2, 4, 8])
@pytest.mark.parametrize("family,group_size,chunks", [
    ("gis", 1, None), ("gis", "pp", None), ("offload", 1, [0]), ("offload", 1, None),
    ("offload", "half", [0])])
def test_nccl_order_of_the_lowered_schedules(pp, family, group_size, chunks):
    """GIS at g = 1 and pp, PO-H / PO-F (g = 1, selective) and GIS-H under NCCL
    semantics on the directed channels, batched sends or not (after the warm-up)."""
    from odc_pp.runtime.p2p_channels import ChannelLayout
    from odc_pp.schedule.validate import check_nccl_order

    group = {"pp": pp, "half": (pp + 1) // 2}.get(group_size, group_size)
    request = ScheduleRequest.of(family, pp=pp, num_microbatches=2 * pp, group_size=group,
                                 offload_chunks=chunks, selective_offload=family == "offload",
                                 post_validation=True)
    schedule = build(request, CostModel(offload_bandwidth=1.0))
    validate(schedule, CostModel(offload_bandwidth=1.0))
    for batch_sends in (True, False):
        check_nccl_order(schedule, ChannelLayout.DIRECTED, batch_sends=batch_sends)
