"""On CUDA: the Triton RoPE (odc_pp.megatron.rope_triton) against megatron's unfused
``_apply_rotary_pos_emb_bshd`` and an fp64 reference -- equal in fp32, at least as close to
the reference in bf16 (fp32 inside, one rounding), on strided q/k views and per-row
angles; auto picks it (skipped without a GPU). CUDA-event times at the Llama-3-8B shape
are printed, not asserted."""

import pytest
import torch

from odc_pp.megatron.rope_triton import FUSED_ROPE, RotaryInAttention, fused_rope, use_fused_rope
from odc_pp.testing.bench import cuda_event_ms, spread


def _megatron(t, freqs):
    from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd
    return _apply_rotary_pos_emb_bshd(t, freqs)


def _run(fn, t, freqs, grad):
    leaf = t.detach().clone().requires_grad_()
    out = fn(leaf, freqs)
    out.backward(grad)
    return out.detach().double(), leaf.grad.double()


def _fused(t, freqs):
    return fused_rope(t, *RotaryInAttention(None, freqs).cos_sin())






@pytest.mark.gpu
def test_triton_rope_matches_megatron_and_reference():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    assert FUSED_ROPE.problem(torch.device("cuda")) is None
    assert use_fused_rope("auto", "cuda") is True
    gen = torch.Generator(device="cuda").manual_seed(0)
    seq, batch, heads, dim = 512, 2, 6, 128
    qkv = torch.randn(seq, batch, heads + 4, dim, device="cuda", generator=gen)
    t = qkv[:, :, 2:2 + heads]  # a strided view, as megatron's split of the QKV output
    grad = torch.randn(seq, batch, heads, dim, device="cuda", generator=gen)
    for rows in (1, batch):
        positions = torch.randint(0, 8192, (seq, rows, 1, dim // 2), device="cuda",
                                  generator=gen).float()
        inv = 1.0 / 500000.0 ** (torch.arange(0, dim, 2, device="cuda") / dim)
        angles = positions * inv
        freqs = torch.cat((angles, angles), dim=-1)
        fused, eager = _run(_fused, t, freqs, grad), _run(_megatron, t, freqs, grad)
        for a, b in zip(fused, eager):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        reference = _run(_megatron, t.double(), freqs.double(), grad.double())
        tb, gb = t.bfloat16(), grad.bfloat16()
        fused, eager = _run(_fused, tb, freqs, gb), _run(_megatron, tb, freqs, gb)
        for name, f, e, r in zip(("output", "gradient"), fused, eager, reference):
            error_fused, error_eager = (f - r).abs().mean(), (e - r).abs().mean()
            assert error_fused <= error_eager * 1.02, (name, rows, error_fused, error_eager)
    q = torch.randn(8192, 1, 32, 128, device="cuda", generator=gen).bfloat16()
    g = torch.randn(8192, 1, 32, 128, device="cuda", generator=gen).bfloat16()
    positions = torch.arange(8192, device="cuda").float()[:, None, None, None]
    angles = positions * (1.0 / 500000.0 ** (torch.arange(0, 128, 2, device="cuda") / 128))
    freqs = torch.cat((angles, angles), dim=-1)
    leaf = q.clone().requires_grad_()
    fused_ms, megatron_ms = (spread(cuda_event_ms(lambda f=f: f(leaf, freqs).backward(g), 20))
                             ["median"] for f in (_fused, _megatron))
    print(f"\nRoPE fwd+bwd of q, 8192 x 32 x 128 bf16: Triton {fused_ms:.3f} ms, megatron "
          f"{megatron_ms:.3f} ms")
