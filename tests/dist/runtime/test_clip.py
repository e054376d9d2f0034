"""odc_pp.optim.clip: local sums, the reduction over several groups, the non-finite
check, the coefficient and the in-place scaling."""

import json
import math

import pytest
import torch

from odc_pp.optim import clip
from odc_pp.testing.launch import LaunchConfig, run_workers


def _tensors(seed, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator).to(dtype) for shape in ((7, 3), (11,), (2, 2, 5))]


def test_local_sum_follows_the_documented_order_bit_for_bit():
    tensors = _tensors(1)
    want64 = 0.0
    for tensor in tensors:
        want64 += float(tensor.double().pow(2).sum())
    got64 = clip.local_sum_of_squares(tensors, dtype=torch.float64, device="cpu")
    assert got64.dtype == torch.float64 and float(got64) == want64
    want32 = torch.zeros((), dtype=torch.float32)
    for tensor in tensors:
        want32 += tensor.pow(2).sum()
    got32 = clip.local_sum_of_squares(tensors, dtype=torch.float32, device="cpu")
    assert got32.dtype == torch.float32 and torch.equal(got32, want32)
    assert float(clip.local_sum_of_squares([], dtype=torch.float64, device="cpu")) == 0.0


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_nonfinite_entry_makes_the_local_sum_nonfinite(bad, dtype):
    tensors = _tensors(2, dtype)
    assert not clip.has_nonfinite(tensors)
    tensors[1][4] = bad
    assert clip.has_nonfinite(tensors)
    for accumulate in (torch.float32, torch.float64):
        total = clip.local_sum_of_squares(tensors, dtype=accumulate, device="cpu")
        assert not math.isfinite(float(total))


def test_clip_scales_only_when_the_coefficient_is_below_one():
    tensors = _tensors(3)
    original = [t.clone() for t in tensors]
    assert not clip.clip_(tensors, clip.GradState(norm_sq=4.0, finite=True), max_norm=2.5)
    assert all(torch.equal(a, b) for a, b in zip(tensors, original))
    assert clip.clip_(tensors, clip.GradState(norm_sq=16.0, finite=True), max_norm=2.0)
    coefficient = 2.0 / (4.0 + 1e-6)
    assert coefficient == clip.clip_coefficient(4.0, 2.0)
    assert all(torch.equal(a, b * coefficient) for a, b in zip(tensors, original))
    state = clip.GradState(norm_sq=0.0, finite=False)
    assert state.norm == math.inf
    assert not clip.clip_(tensors, state, max_norm=2.0)  # skipped, never scaled
    with pytest.raises(ValueError, match="max_norm"):
        clip.clip_(tensors, clip.GradState(norm_sq=1.0, finite=True), max_norm=0.0)


def test_rejects_bad_groups_and_timeouts():
    with pytest.raises(ValueError, match="non-empty"):
        clip.group_list([])
    with pytest.raises(ValueError, match="timeout_s"):
        clip.GradStateReduction(1.0, None, device="cpu", timeout_s=0)


def _worker(rank, world_size, out_path):
    import torch.distributed as dist

    own = None
    for member in range(world_size):  # every rank creates every group
        group = dist.new_group([member])
        if member == rank:
            own = group
    report = {}
    # [own group, WORLD]: the first reduction is a no-op, the second sums over ranks
    local = clip.local_sum_of_squares(_tensors(10 + rank), dtype=torch.float64, device="cpu")
    reduction = clip.GradStateReduction(local, [own, dist.group.WORLD], device="cpu",
                                        timeout_s=60.0)
    state = reduction.wait()
    report["finite"] = [state.finite, state.norm_sq]
    with pytest.raises(ValueError, match="already"):
        reduction.wait()
    tensors = _tensors(20 + rank)
    if rank == 1:
        tensors[0][0, 0] = math.nan
    local = clip.local_sum_of_squares(tensors, dtype=torch.float32, device="cpu")
    state = clip.global_grad_state(local, dist.group.WORLD, device="cpu", timeout_s=60.0)
    report["nonfinite"] = [state.finite, state.norm_sq, state.norm]
    with open(f"{out_path}.{rank}", "w") as handle:
        json.dump(report, handle)


@pytest.mark.multiproc
def test_reduction_over_groups_and_the_flag_reach_every_rank(tmp_path):
    run_workers(_worker, 2, str(tmp_path / "clip"), config=LaunchConfig(timeout_s=120))
    want = sum(float(clip.local_sum_of_squares(_tensors(10 + rank), dtype=torch.float64,
                                               device="cpu")) for rank in range(2))
    for rank in range(2):
        report = json.loads((tmp_path / f"clip.{rank}").read_text())
        assert report["finite"] == [True, want]
        assert report["nonfinite"] == [False, 0.0, math.inf]
