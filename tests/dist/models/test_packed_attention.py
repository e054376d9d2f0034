"""Packed-sequence attention (odc_pp.megatron.packed_attention) on CPU against the pre-issue-21
path (K/V expanded with repeat_interleave, SDPA with the dense ``s x s`` mask), fp32:
the segment metadata, every kernel (dense with enable_gqa, FlexAttention forward, varlen
through its cu_seqlens layout with a reference kernel and both torch signatures), the
deterministic kernel choice, and a GQA model's logits and gradients through each path."""

import json
import math

import pytest
import torch

from odc_pp.megatron import packed_attention as pa
from odc_pp.megatron.packed_attention import (PackedSegments, packed_attention,
                                              packed_causal_mask, resolve_kernel)
from odc_pp.testing.launch import LaunchConfig, run_workers

TOL = dict(rtol=1e-6, atol=1e-6)
# two rows: four documents and a padding tail; a full-length document and one of length 1
SEGMENTS = torch.tensor([[0] * 5 + [1] * 3 + [2] * 6 + [3] + [-1] * 3,
                         [0] * 17 + [1]])


def old_path(q, k, v, segment_ids, scale):
    """The core attention before issue 21 (SdpaDotProductAttention with a packed mask)."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=~packed_causal_mask(segment_ids), scale=scale)


def reference_varlen(q, k, v, cu_seqlens, max_seqlen, scale):
    """The varlen contract on [tokens, heads, dim]: causal attention within each
    [cu[i], cu[i+1]) run, K/V heads shared by groups of query heads."""
    assert cu_seqlens.dtype == torch.int32 and int(cu_seqlens[-1]) == q.shape[0]
    groups = q.shape[1] // k.shape[1]
    out = torch.empty_like(q)
    bounds = cu_seqlens.tolist()
    assert max(b - a for a, b in zip(bounds, bounds[1:])) == max_seqlen
    for start, end in zip(bounds, bounds[1:]):
        qs, ks, vs = (t[start:end].transpose(0, 1) for t in (q, k, v))
        ks, vs = ks.repeat_interleave(groups, 0), vs.repeat_interleave(groups, 0)
        out[start:end] = torch.nn.functional.scaled_dot_product_attention(
            qs, ks, vs, is_causal=True, scale=scale).transpose(0, 1)
    return out


def _qkv(heads=4, groups=2, dim=8, seed=0):
    generator = torch.Generator().manual_seed(seed)
    batch, seq = SEGMENTS.shape
    return (torch.randn(batch, heads, seq, dim, generator=generator),
            torch.randn(batch, groups, seq, dim, generator=generator),
            torch.randn(batch, groups, seq, dim, generator=generator))


def test_segment_metadata():
    segments = PackedSegments(SEGMENTS, "cpu")
    # row 0: 5, 3, 6, 1 and three padding positions of length 1; row 1: 17, 1
    assert segments.cu_seqlens.tolist() == [0, 5, 8, 14, 15, 16, 17, 18, 35, 36]
    assert segments.cu_seqlens.dtype == torch.int32
    assert segments.max_seqlen == 17 and segments.contiguous
    assert torch.equal(segments.dense_mask(), packed_causal_mask(SEGMENTS))
    assert not PackedSegments(torch.tensor([[0, 0, 1, 0]]), "cpu").contiguous
    with pytest.raises(ValueError, match="must be one of"):
        PackedSegments(SEGMENTS, "cpu", kernel="flash")


@pytest.mark.parametrize("heads, groups", [(4, 2), (4, 1), (2, 2)])
def test_every_kernel_matches_the_old_dense_path(heads, groups):
    q, k, v = _qkv(heads, groups)
    scale = 0.3
    expected = old_path(q, k, v, SEGMENTS, scale)
    segments = PackedSegments(SEGMENTS, "cpu")
    for kernel in ("dense", "flex"):
        got = packed_attention(q, k, v, segments, scale=scale, kernel=kernel)
        torch.testing.assert_close(got, expected, **TOL, msg=kernel)
    got = packed_attention(q, k, v, segments, scale=scale, kernel="varlen",
                           varlen=reference_varlen)
    torch.testing.assert_close(got, expected, **TOL)


@pytest.mark.parametrize("signature", ["torch-2.13", "torch-2.10"])
def test_torch_varlen_adapter_for_both_signatures(signature):
    """varlen_attn changed from is_causal (no scale, no GQA) to window_size + scale +
    enable_gqa; the adapter calls either correctly."""
    calls = []

    def new_api(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1),
                enable_gqa=False):
        calls.append({"window_size": window_size, "enable_gqa": enable_gqa})
        assert window_size == (-1, 0) and (enable_gqa or q.shape[1] == k.shape[1])
        return reference_varlen(q, k, v, cu_q, max_q, scale)

    def old_api(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=False):
        calls.append({"is_causal": is_causal})
        assert is_causal and q.shape[1] == k.shape[1]
        return reference_varlen(q, k, v, cu_q, max_q, 1.0 / math.sqrt(q.shape[-1]))

    import functools
    import inspect

    fn = new_api if signature == "torch-2.13" else old_api
    varlen = functools.partial(pa._torch_varlen, fn, inspect.signature(fn).parameters)
    q, k, v = _qkv()
    expected = old_path(q, k, v, SEGMENTS, 0.3)
    got = packed_attention(q, k, v, PackedSegments(SEGMENTS, "cpu"), scale=0.3,
                           kernel="varlen", varlen=varlen)
    torch.testing.assert_close(got, expected, **TOL)
    assert len(calls) == 1


def test_kernel_choice_is_a_function_of_device_dtype_dropout(monkeypatch):
    monkeypatch.setattr(pa, "varlen_backend", lambda groups: ("fake", reference_varlen))
    cuda = dict(device="cuda", dropout=0.0)
    assert resolve_kernel("auto", dtype=torch.bfloat16, **cuda) == "varlen"
    assert resolve_kernel("auto", dtype=torch.float32, **cuda) == "flex"
    # auto never picks a kernel that refuses the shape (Inductor's flex: head dim >= 16;
    # flash: a multiple of 8 up to 256); the GPU test's fp32 model has head dim 8
    assert resolve_kernel("auto", dtype=torch.float32, head_dim=8, **cuda) == "dense"
    assert resolve_kernel("auto", dtype=torch.float32, head_dim=16, **cuda) == "flex"
    assert resolve_kernel("auto", dtype=torch.bfloat16, head_dim=20, **cuda) == "flex"
    assert resolve_kernel("auto", dtype=torch.bfloat16, head_dim=8, contiguous=False,
                          **cuda) == "dense"
    with pytest.raises(ValueError, match="head dimension >= 16"):
        resolve_kernel("flex", dtype=torch.float32, head_dim=8, **cuda)
    assert resolve_kernel("auto", dtype=torch.bfloat16, contiguous=False, **cuda) == "flex"
    assert resolve_kernel("auto", device="cuda", dtype=torch.bfloat16, dropout=0.1) == "dense"
    assert resolve_kernel("auto", device="cpu", dtype=torch.float32, dropout=0.0) == "dense"
    assert resolve_kernel("dense", dtype=torch.bfloat16, **cuda) == "dense"
    assert resolve_kernel("flex", device="cpu", dtype=torch.float32, dropout=0.0) == "flex"
    with pytest.raises(ValueError, match="varlen needs CUDA"):
        resolve_kernel("varlen", device="cpu", dtype=torch.bfloat16, dropout=0.0)
    with pytest.raises(ValueError, match="no CPU backward"):
        resolve_kernel("flex", device="cpu", dtype=torch.float32, dropout=0.0,
                       needs_grad=True)
    monkeypatch.setattr(pa, "varlen_backend", lambda groups: None)
    assert resolve_kernel("auto", dtype=torch.bfloat16, **cuda) == "flex"


def _model_worker(rank, world_size, out_path):
    from odc_pp.data import Microbatch
    from odc_pp.training.distributed import standalone_process_groups
    from odc_pp.megatron.model import ModelConfig, build_chunks

    groups = standalone_process_groups()
    batch, seq = SEGMENTS.shape
    tokens = torch.randint(0, 64, (batch, seq), generator=torch.Generator().manual_seed(3))
    positions = torch.stack([torch.cat([torch.arange(n) for n in lengths]) for lengths in
                             ([5, 3, 6, 1, 3], [17, 1])])
    microbatch = Microbatch(tokens=tokens, labels=tokens, position_ids=positions,
                            segment_ids=SEGMENTS)
    common = dict(vocab_size=64, hidden_size=32, num_layers=2, num_attention_heads=4,
                  num_query_groups=2, ffn_hidden_size=48, normalization="RMSNorm",
                  activation="swiglu", position_embedding_type="rope",
                  add_bias_linear=False, max_sequence_length=32)
    runs = {"host": dict(attention_backend="host"),
            "sdpa-auto": dict(attention_backend="sdpa"),
            "sdpa-flex": dict(attention_backend="sdpa", packed_attention="flex")}
    report = {}
    outputs = {}
    for name, extra in runs.items():
        (chunk,) = build_chunks(ModelConfig(**common, **extra), pp_rank=0, pp_size=1, seed=7,
                                process_groups=groups)
        if name == "sdpa-flex":  # FlexAttention has no CPU backward: forward only
            with torch.no_grad():
                outputs[name] = (chunk.logits_or_hidden(None, microbatch), None)
            continue
        logits = chunk.logits_or_hidden(None, microbatch)
        logits.square().mean().backward()
        outputs[name] = (logits.detach(), {n: p.grad.clone() for n, p in
                                           chunk.global_named_parameters()})
    host_logits, host_grads = outputs["host"]
    for name in ("sdpa-auto", "sdpa-flex"):
        logits, grads = outputs[name]
        report[f"{name}/logits"] = float((logits - host_logits).abs().max()
                                         / host_logits.abs().max())
        if grads is not None:
            report[f"{name}/grads"] = max(float((grads[n] - host_grads[n]).abs().max()
                                                / host_grads[n].abs().max().clamp_min(1e-30))
                                          for n in host_grads)
    # the frontend flag reaches the model config
    from odc_pp.training.arguments import parse_args
    from odc_pp.training.model_setup import model_config

    args = parse_args(["--mock-data", "--vocab-size", "64", "--packed-attention", "flex"])
    report["cli"] = model_config(args.model, vocab_size=64, device="cpu",
                                 num_stages=1).packed_attention
    with open(out_path, "w") as handle:
        json.dump(report, handle)


@pytest.mark.multiproc
def test_gqa_model_logits_equal_the_host_path(tmp_path):
    out = tmp_path / "report.json"
    run_workers(_model_worker, 1, str(out), config=LaunchConfig(timeout_s=300))
    report = json.loads(out.read_text())
    assert report.pop("cli") == "flex"
    assert set(report) == {"sdpa-auto/logits", "sdpa-auto/grads", "sdpa-flex/logits"}
    assert all(value <= 1e-5 for value in report.values()), report


def test_packed_attention_flag_choices_are_the_kernels():
    from odc_pp.training.arguments import CHOICES, parse_args

    assert CHOICES["packed_attention"] == pa.PACKED_KERNELS
    with pytest.raises(ValueError, match="--packed-attention 'flash': invalid choice"):
        parse_args(["--mock-data", "--vocab-size", "64", "--packed-attention", "flash"])
