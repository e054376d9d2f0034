"""odc_pp.megatron.rms_norm: on the CPU the RMSNorm keeps for backward only what torch's
fused CUDA kernel keeps (the input and the fp32 reciprocal RMS), so the memory dry run
counts a GPU's activations; its output is bitwise torch's and its gradients agree to
fp32 rounding."""

from __future__ import annotations

import pytest
import torch

from odc_pp.megatron.rms_norm import RMSNorm, RMSNorm1P
from odc_pp.testing.saved import saved_bytes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("ours,theirs", [(RMSNorm, torch.nn.RMSNorm), (RMSNorm1P, None)])
def test_same_values_and_gradients_as_torch(dtype, ours, theirs):
    torch.manual_seed(0)
    mine = ours(64, eps=1e-5).to(dtype)
    with torch.no_grad():
        mine.weight.normal_()
    reference = torch.nn.RMSNorm(64, eps=1e-5).to(dtype)
    with torch.no_grad():
        reference.weight.copy_(mine.weight + (1 if ours is RMSNorm1P else 0))
    x = torch.randn(3, 5, 64, dtype=dtype)
    grad = torch.randn(3, 5, 64, dtype=dtype)
    outputs = []
    for module in (mine, reference):
        leaf = x.clone().requires_grad_()
        out = module(leaf)
        out.backward(grad)
        outputs.append((out.detach(), leaf.grad, module.weight.grad))
    (out, gx, gw), (ref_out, ref_gx, ref_gw) = outputs
    assert torch.equal(out, ref_out)
    tolerance = dict(rtol=1e-5, atol=1e-5) if dtype is torch.float32 else \
        dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(gx, ref_gx, **tolerance)
    torch.testing.assert_close(gw, ref_gw, **tolerance)


def test_keeps_the_input_and_the_reciprocal_rms_only():
    x = torch.randn(128, 64, dtype=torch.bfloat16, requires_grad=True) * 1
    ours = RMSNorm(64, eps=1e-5).to(torch.bfloat16)
    torch_norm = torch.nn.RMSNorm(64, eps=1e-5).to(torch.bfloat16)
    assert saved_bytes(ours, x, exclude=(ours.weight,)) == 128 * 64 * 2 + 128 * 4
    assert saved_bytes(torch_norm, x, exclude=(torch_norm.weight,)) >= 2 * 128 * 64 * 4  # fp32 copies on the CPU
