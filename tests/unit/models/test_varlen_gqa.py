"""GQA-native varlen attention (odc_pp.megatron.varlen_gqa, issue 50): on a torch whose
varlen_attn has no enable_gqa, packed attention calls the aten flash ops with the K/V
heads as they are (no repeat_interleave). CPU: the autograd plumbing with reference ops
standing in for the CUDA flash kernels, and the backend choice; the kernels themselves
are checked on the GPU (gqa_flash_problem, the attention stage)."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from odc_pp.megatron import packed_attention as pa
from odc_pp.megatron import varlen_gqa


def _reference(q, k, v, cu, scale):
    """Causal attention per document, K/V heads shared by groups of query heads."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    outs = []
    for start, end in zip(cu[:-1].tolist(), cu[1:].tolist()):
        qd, kd, vd = (t[start:end].transpose(0, 1) for t in (q, k, v))
        outs.append(torch.nn.functional.scaled_dot_product_attention(
            qd, kd, vd, is_causal=True, scale=scale).transpose(0, 1))
    return torch.cat(outs)


def _fake_ops(seen):
    def forward(q, k, v, cu_q, cu_k, max_q, max_k, dropout, causal, debug, *, scale):
        seen.append(("forward", q.shape[1], k.shape[1], v.shape[1]))
        assert causal and dropout == 0.0 and cu_q is cu_k and max_q == max_k
        out = _reference(q, k, v, cu_q, scale)
        return out, torch.zeros(q.shape[1], q.shape[0]), torch.zeros(2), torch.zeros(0), None

    def backward(grad, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, dropout, causal, rng,
                 unused, *, scale):
        seen.append(("backward", q.shape[1], k.shape[1], grad.is_contiguous()))
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        with torch.enable_grad():
            _reference(*leaves, cu_q, scale).backward(grad)
        return tuple(t.grad for t in leaves)

    return forward, backward


def test_k_and_v_reach_the_kernel_with_their_own_heads():
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(12, 8, 16, generator=generator, dtype=torch.float64)
    k, v = (torch.randn(12, 2, 16, generator=generator, dtype=torch.float64) for _ in "kv")
    grad = torch.randn(12, 8, 16, generator=generator, dtype=torch.float64)
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    seen = []
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = varlen_gqa.flash_varlen_gqa(*leaves, cu, 7, 0.25, ops=_fake_ops(seen))
    out.backward(grad.transpose(0, 1).contiguous().transpose(0, 1))  # not contiguous
    assert seen == [("forward", 8, 2, 2), ("backward", 8, 2, True)]
    refs = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = _reference(*refs, cu, 0.25)
    expected.backward(grad)
    torch.testing.assert_close(out, expected)
    for got, want in zip(leaves, refs):
        assert got.grad.shape == want.shape
        torch.testing.assert_close(got.grad, want.grad)
    with pytest.raises(ValueError, match="not a multiple"):
        varlen_gqa.flash_varlen_gqa(q, k[:, :1].expand(12, 3, 16), v, cu, 7, 0.25,
                                    ops=_fake_ops([]))


def test_a_varlen_attn_without_enable_gqa_gets_the_gqa_native_backend(monkeypatch):
    """torch 2.11's varlen_attn (no enable_gqa): GQA runs the aten flash ops with the
    K/V heads as they are, not the repeated heads."""
    def old_varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, *, is_causal=False, scale=None):
        raise AssertionError("not called on the CPU")

    fake = types.ModuleType("torch.nn.attention.varlen")
    fake.varlen_attn = old_varlen_attn
    monkeypatch.setitem(sys.modules, "torch.nn.attention.varlen", fake)
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # not installed
    pa.varlen_backend.cache_clear()
    try:
        assert pa.varlen_backend(4)[0] == "aten.flash_varlen_gqa"
        assert pa.varlen_backend(1)[0] == "torch.varlen_attn"
    finally:
        pa.varlen_backend.cache_clear()


def test_the_check_says_why_not_off_cuda():
    assert "CUDA device" in varlen_gqa.gqa_flash_problem("cpu")
