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
