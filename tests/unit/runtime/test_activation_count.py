"""The runtime's activation count (odc_pp.runtime.offload.ActivationStore, the log's
peak_activation_mb) counts each saved storage's bytes once: a tensor saved as several views
(a reshape, a transpose, overlapping slices) is one allocation, not several."""

import torch

from odc_pp.runtime import ActivationStore
from odc_pp.runtime.offload import _newly_covered


class _SaveViews(torch.autograd.Function):
    """Saves x as views: itself, a reshape, a transpose, two overlapping halves."""

    @staticmethod
    def forward(ctx, x):
        half = x.shape[0] // 2
        ctx.save_for_backward(x, x.reshape(-1), x.t(), x[:half + 1], x[half - 1:])
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


def test_views_of_one_storage_count_once():
    store = ActivationStore(parameters=[], device="cpu", min_offload_bytes=0)
    x = torch.randn(8, 16, requires_grad=True)
    inner = x * 1.0  # an activation the store does not see yet
    with store.capture((0, 0)):
        out = _SaveViews.apply(inner)
    assert store.resident_bytes == inner.numel() * 4  # not 4x
    out.sum().backward()
    store.release((0, 0))
    assert store.resident_bytes == 0 and store.peak_resident_bytes == 8 * 16 * 4


def test_disjoint_slices_add_up_and_offload_accounts_the_same():
    store = ActivationStore(parameters=[], device="cpu", min_offload_bytes=0)
    x = torch.randn(10, 4, requires_grad=True) * 1.0

    class SaveSlices(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            ctx.save_for_backward(t[:3], t[5:])  # 3 + 5 rows of 4 fp32
            return t.clone()

        @staticmethod
        def backward(ctx, grad):
            return grad

    with store.capture((0, 1)):
        SaveSlices.apply(x)
    assert store.resident_bytes == 8 * 4 * 4
    assert store.offload((0, 1)) == 8 * 4 * 4 and store.resident_bytes == 0


def test_range_union():
    ranges = []
    assert _newly_covered(ranges, 0, 10) == 10
    assert _newly_covered(ranges, 5, 15) == 5
    assert _newly_covered(ranges, 20, 30) == 10
    assert _newly_covered(ranges, 0, 30) == 5  # only the gap [15, 20)
    assert ranges == [(0, 30)]
