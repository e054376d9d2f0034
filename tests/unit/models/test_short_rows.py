"""Unpacked rows shorter than --seq-length go through the varlen kernel as one document per
row where auto picks varlen (CUDA bf16; odc_pp.megatron.packed_attention.short_row_segments),
and that equals is_causal SDPA."""

import torch

from odc_pp.megatron import packed_attention as pa
from tests.dist.models.test_packed_attention import reference_varlen


def _cuda_varlen(monkeypatch):
    monkeypatch.setattr(pa, "varlen_backend", lambda groups: ("test", reference_varlen))


def test_short_rows_only_where_varlen_runs(monkeypatch):
    common = dict(full_length=16, dtype=torch.bfloat16, dropout=0.0, head_dim=128)
    assert pa.short_row_segments(2, 9, "cpu", **common) is None  # CPU: is_causal SDPA
    _cuda_varlen(monkeypatch)
    resolve = pa.resolve_kernel
    monkeypatch.setattr(pa, "resolve_kernel",
                        lambda request, *, device, **kw: resolve(request, device="cuda", **kw))
    segments = pa.short_row_segments(2, 9, "cpu", **common)
    assert segments.cu_seqlens.tolist() == [0, 9, 18] and segments.max_seqlen == 9
    assert segments.kernel == "varlen" and segments.contiguous
    assert pa.short_row_segments(2, 16, "cpu", **common) is None  # full rows keep SDPA
    assert pa.short_row_segments(2, 9, "cpu", **{**common, "dtype": torch.float32}) is None
    assert pa.short_row_segments(2, 9, "cpu", **{**common, "dropout": 0.1}) is None


def test_one_document_per_row_equals_is_causal(monkeypatch):
    _cuda_varlen(monkeypatch)
    gen = torch.Generator().manual_seed(0)
    batch, heads, groups, seq, dim = 2, 4, 2, 11, 8
    q = torch.randn(batch, heads, seq, dim, generator=gen)
    k, v = (torch.randn(batch, groups, seq, dim, generator=gen) for _ in range(2))
    expected = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=True, scale=0.3, enable_gqa=True)
    segments = pa.PackedSegments(torch.zeros(batch, seq, dtype=torch.int64), "cpu",
                                 kernel="varlen")
    got = pa.packed_attention(q, k, v, segments, scale=0.3, kernel="varlen",
                              varlen=reference_varlen)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
