"""odc_pp.megatron.swiglu: the MLP's SwiGLU saves only its input (Megatron's default fused
bias-SwiGLU keeps the same) and its gradients are bitwise those of megatron's unfused
``silu(gate) * up`` under autograd."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from odc_pp.megatron.swiglu import swiglu
from odc_pp.testing.saved import saved_bytes


def _unfused(x):
    gate, up = torch.chunk(x, 2, dim=-1)
    return F.silu(gate) * up


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradients_are_bitwise_the_unfused_ones(dtype):
    torch.manual_seed(0)
    x = torch.randn(3, 5, 2 * 48, dtype=dtype)
    grad = torch.randn(3, 5, 48, dtype=dtype)
    results = []
    for function in (_unfused, swiglu):
        leaf = x.clone().requires_grad_()
        out = function(leaf)
        out.backward(grad)
        results.append((out.detach(), leaf.grad))
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])


def test_saves_only_its_input():
    x = torch.randn(4, 2 * 64, requires_grad=True)
    fc1_output = x * 1.0  # what linear_fc1 hands the activation
    assert saved_bytes(swiglu, fc1_output) == fc1_output.untyped_storage().nbytes()
    assert saved_bytes(_unfused, fc1_output) == 1.5 * fc1_output.untyped_storage().nbytes()


def test_fused_swiglu_flag_off_the_gpu():
    """--fused-swiglu: auto keeps the eager path where the Triton kernels cannot run (CPU),
    on is one error saying why, off never asks; a fused module on a CPU tensor runs the
    eager function."""
    from odc_pp.megatron.swiglu import SwiGLU, use_fused_swiglu

    assert use_fused_swiglu("auto", "cpu") is False
    assert use_fused_swiglu("off", "cuda") is False
    with pytest.raises(ValueError, match="--fused-swiglu on: .*(Triton|CUDA)"):
        use_fused_swiglu("on", "cpu")
    x = torch.randn(2, 3, 2 * 16)
    assert torch.equal(SwiGLU(fused=True)(x), swiglu(x))


def test_fused_rope_refuses_a_rotary_narrower_than_the_head():
    """The Triton RoPE rotates whole heads; a narrower rotary embedding (megatron's
    rotary_percent < 1) is one error naming the flag, never a wrong rotation."""
    from odc_pp.megatron.rope_triton import RotaryInAttention

    q, k = torch.randn(4, 1, 2, 16), torch.randn(4, 1, 1, 16)
    with pytest.raises(ValueError, match="--fused-rope"):
        RotaryInAttention(None, torch.randn(4, 1, 1, 8)).apply(q, k)
