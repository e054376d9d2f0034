"""The local sum of squares of the gradient norm allocates no full-size temporary
(issue 50: ``pow(2)`` on the whole fp32 buffer made a 7.16 GiB temporary at the
Llama-3-8B step). Allocations are recorded by a dispatch mode: every op output whose
storage is none of its inputs' is a new allocation."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from odc_pp.optim import clip

PIECE = 1 << 14


class _Allocations(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.sizes: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor)}
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor) and \
                    tensor.untyped_storage().data_ptr() not in inputs:
                self.sizes.append(tensor.untyped_storage().nbytes())
        return out


@pytest.mark.parametrize("grad_dtype, dtype", [(torch.float32, torch.float32),
                                               (torch.bfloat16, torch.float32),
                                               (torch.float32, torch.float64)])
def test_no_temporary_beyond_one_piece(monkeypatch, grad_dtype, dtype):
    monkeypatch.setattr(clip, "SQUARES_CHUNK_ELEMENTS", PIECE, raising=False)
    generator = torch.Generator().manual_seed(0)
    buffer = torch.randn(1 << 20, generator=generator).to(grad_dtype)  # 64 pieces
    views = [buffer[:1000].view(10, 100), buffer[1000:]]
    with _Allocations() as seen:
        total = clip.local_sum_of_squares(views, dtype=dtype, device="cpu")
    largest = max(seen.sizes)
    piece_bytes = PIECE * torch.finfo(dtype).bits // 8
    assert largest <= piece_bytes, f"a {largest}-byte temporary (piece: {piece_bytes})"
    assert largest * 32 <= buffer.numel() * torch.finfo(dtype).bits // 8
    exact = buffer.double().pow(2).sum()
    assert total.dtype == dtype
    assert abs(float(total) - float(exact)) <= 1e-5 * float(exact)


def test_non_contiguous_tensors_are_walked_in_row_pieces(monkeypatch):
    monkeypatch.setattr(clip, "SQUARES_CHUNK_ELEMENTS", PIECE, raising=False)
    matrix = torch.randn(512, 512, generator=torch.Generator().manual_seed(1)).t()
    with _Allocations() as seen:
        total = clip.local_sum_of_squares([matrix], dtype=torch.float32, device="cpu")
    assert max(seen.sizes) <= PIECE * 4
    assert torch.allclose(total, matrix.pow(2).sum(), rtol=1e-5)
