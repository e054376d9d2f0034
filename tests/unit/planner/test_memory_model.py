"""Formulas of odc_pp.planner.memory (torch-free, fast)."""

from __future__ import annotations

import pytest

from odc_pp.planner.memory import (ChunkBytes, UnitSizes, count_sends, schedule_peak,
                                         state_bytes)
from odc_pp.schedule.build import ScheduleRequest, build


def test_state_bytes_per_parameter():
    sizes = UnitSizes(unit_params=(1000, 3000), dp=4, param_bytes=2, deterministic=True,
                      post_validation=True)
    new = state_bytes(sizes)
    assert new["params_gathered"] == 2 * 4000
    assert new["params_sharded"] == 2 * (250 + 750)
    assert new["grad_accumulators"] == 4 * 1000
    assert new["optimizer_state"] == 12 * 1000  # moments + fp32 master (weight decay: no mask)
    assert new["odc_staging"] == 4 * 4000
    assert new["post_validation_snapshot"] == 16 * 1000
    assert new["weight_grads"] == 2 * 2 * 3000  # the largest chunk's .grad + its flat copy
    # tensor parallelism, tp rank > 0: a gradient-norm mask where a replicated parameter is
    tp = state_bytes(UnitSizes(unit_params=(1000, 3000), dp=4, param_bytes=2,
                               deterministic=True, post_validation=True,
                               norm_mask=(False, True)))
    assert tp["optimizer_state"] == new["optimizer_state"] + 750
    fp32 = state_bytes(UnitSizes(unit_params=(1000,), dp=1, param_bytes=4,
                                 deterministic=False, post_validation=False))
    assert fp32["optimizer_state"] == 8 * 1000 and fp32["odc_staging"] == 0  # moments only


@pytest.mark.parametrize("name,chunks", [("1f1b", 1), ("zbv", 2)])
def test_schedule_peak_keeps_sends_only_in_flight(name, chunks):
    pp, m = 4, 16
    schedule = build(ScheduleRequest.of(name, pp=pp, num_microbatches=m, num_chunks=chunks))
    sizes = [ChunkBytes(saved=100, w_held=10)] * chunks
    for rank in range(pp):
        peak = schedule_peak(schedule, rank, sizes, message_bytes=1)
        assert peak["sends"] <= 2 * pp < count_sends(schedule, rank)
        assert 0 < peak["activations"] <= 2 * pp * 100 * chunks


def test_local_accumulation_is_megatrons_state_per_parameter():
    """Issue 29: model states <= 18 bytes per parameter at dp=1 (one bf16 copy, one fp32
    gradient, fp32 master + Adam), <= 6 + 18/dp at dp > 1 (a gathered bf16 copy and a
    local fp32 gradient, plus the owned shard's bf16, fp32 accumulator and Adam state)."""
    params = 8000
    for dp in (1, 2, 8):
        sizes = UnitSizes(unit_params=(params,), dp=dp, param_bytes=2, deterministic=True,
                          post_validation=False, local_grads=True)
        total = sum(state_bytes(sizes).values())
        assert total == (18 * params if dp == 1 else 6 * params + 18 * params // dp), dp
    pushed = sum(state_bytes(UnitSizes(unit_params=(params,), dp=1, param_bytes=2,
                                       deterministic=True, post_validation=False)).values())
    assert pushed == 26 * params  # per-microbatch pushes: two bf16 grads and fp32 staging


def test_bf16_main_grad_is_megatrons_grad_reduce_in_bf16():
    """--grad-reduce-in-bf16: the local gradient costs 2 bytes per parameter at dp > 1
    (4 + 18/dp in all); at dp=1 it is the owner's fp32 accumulator either way."""
    params = 8000
    for dp in (1, 8):
        sizes = UnitSizes(unit_params=(params,), dp=dp, param_bytes=2, deterministic=True,
                          post_validation=False, local_grads=True, main_grad_bytes=2)
        state = state_bytes(sizes)
        assert state["weight_grads"] == (0 if dp == 1 else 2 * params)
        assert sum(state.values()) == (18 * params if dp == 1 else 4 * params + 18 * params // dp)


def test_offloaded_activations_stay_on_the_device_until_their_copy_completes():
    """The runtime frees an offloaded chunk's device memory when the copy to the host
    completes, not when OFFLOAD is issued: at the peak, a chunk whose copy is still in
    flight is on the device (``offload_device``); the walk used to drop it at issue."""
    from odc_pp.schedule.costs import CostModel

    pp, m = 4, 8
    request = ScheduleRequest.of("offload", pp=pp, num_microbatches=m, offload_chunks=[0, 1])
    schedule = build(request, CostModel(offload_bandwidth=1.0))
    sizes = [ChunkBytes(saved=100, w_held=0)] * 2
    for rank in range(pp):
        def peak(bandwidth):
            out = schedule_peak(schedule, rank, sizes, message_bytes=0,
                                costs=CostModel(offload_bandwidth=bandwidth))
            return sum(out.values()), out["offload_device"]
        fast, slow = peak(1000.0), peak(0.01)
        assert slow[0] >= fast[0] and slow[1] == 100, (rank, fast, slow)
