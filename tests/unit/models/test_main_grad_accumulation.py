"""Weight gradients summed into ``main_grad`` (issue 29: the GEMM accumulates into the fp32
buffer, Megatron's gradient_accumulation_fusion): with bf16 activations and an fp32
``main_grad`` the sum is the fp32 sum of the exact products (no bf16 rounding of each
microbatch's product), in W (deferred) and in B (not deferred: no ``.grad`` left behind);
with equal dtypes it is bitwise the product added as before."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from odc_pp.megatron.layers import accumulate_into_main_grad, accumulate_weight_grad
from odc_pp.megatron.layers import weight_grad_or_defer


def _inputs(dtype, microbatches=3, tokens=64, fan_in=48, fan_out=40):
    generator = torch.Generator().manual_seed(0)
    return [(torch.randn(tokens, fan_in, generator=generator).to(dtype),
             torch.randn(tokens, fan_out, generator=generator).to(dtype))
            for _ in range(microbatches)]


def test_mixed_dtypes_sum_the_exact_products_in_fp32():
    pairs = _inputs(torch.bfloat16)
    main_grad = torch.zeros(40, 48)
    for x, g in pairs:
        accumulate_into_main_grad(main_grad, x, g)
    exact = sum(g.double().t() @ x.double() for x, g in pairs)
    error = (main_grad.double() - exact).abs().max() / exact.abs().max()
    rounded = sum((g.t() @ x).double() for x, g in pairs)  # the bf16 product per microbatch
    rounded_error = (rounded - exact).abs().max() / exact.abs().max()
    assert error < 1e-6 < rounded_error  # fp32 accumulation, not the bf16-rounded product


def test_equal_dtypes_add_the_product_bitwise():
    pairs = _inputs(torch.float32)
    main_grad, expected = torch.zeros(40, 48), torch.zeros(40, 48)
    for x, g in pairs:
        accumulate_into_main_grad(main_grad, x, g)
        expected.add_(g.t().matmul(x))
    assert torch.equal(main_grad, expected)


class _Layer:
    wgrad_queue = None
    keep_sp_input_for_w = False


def test_b_without_deferral_adds_into_main_grad_and_returns_none():
    weight = torch.nn.Parameter(torch.zeros(40, 48, dtype=torch.bfloat16))
    weight.main_grad = torch.zeros(40, 48)
    (x, g), = _inputs(torch.bfloat16, microbatches=1)
    assert weight_grad_or_defer(_Layer(), weight, x, g) is None
    assert weight.grad is None
    assert torch.allclose(weight.main_grad, g.float().t() @ x.float(), rtol=1e-5, atol=1e-5)
    plain = torch.nn.Parameter(torch.zeros(40, 48))  # no engine: the gradient is returned
    assert torch.equal(weight_grad_or_defer(_Layer(), plain, x.float(), g.float()),
                       g.float().t() @ x.float())


def test_deferred_w_adds_into_main_grad():
    weight = torch.nn.Parameter(torch.zeros(40, 48, dtype=torch.bfloat16))
    weight.main_grad = torch.zeros(40, 48)
    (x, g), = _inputs(torch.bfloat16, microbatches=1)
    accumulate_weight_grad(weight, x, g)
    assert weight.grad is None
    assert torch.allclose(weight.main_grad, g.float().t() @ x.float(), rtol=1e-5, atol=1e-5)


def test_dry_run_allocates_no_product():
    """Under FakeTensorMode (the dry run) the mixed-dtype sum is the one fused GEMM the GPU
    runs: nothing of the weight's size is allocated beside main_grad."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Allocations(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.shapes = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor) and "out" not in (kwargs or {}):
                self.shapes.append(tuple(out.shape))
            return out

    with FakeTensorMode():
        main_grad = torch.zeros(40, 48)
        x, g = torch.randn(64, 48).bfloat16(), torch.randn(64, 40).bfloat16()
        with Allocations() as seen:
            accumulate_into_main_grad(main_grad, x, g)
    assert (40, 48) not in seen.shapes
