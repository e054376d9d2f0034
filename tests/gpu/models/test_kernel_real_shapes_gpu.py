"""On CUDA: every Triton self-check passes at the Llama-3-8B shapes in bf16 (the kernels
the step runs; issue 50), and each compiles once (a second check is a cache hit)."""

import time

import pytest
import torch


@pytest.mark.gpu
def test_checks_pass_at_the_real_shapes():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from odc_pp.megatron.cross_entropy_inplace import INPLACE_CROSS_ENTROPY
    from odc_pp.megatron.rope_triton import FUSED_ROPE
    from odc_pp.megatron.swiglu_triton import FUSED_SWIGLU

    device = torch.device("cuda")
    for check, shape in ((FUSED_SWIGLU, (14336, torch.bfloat16)),
                         (FUSED_ROPE, (32, 8, 128, torch.bfloat16)),
                         (INPLACE_CROSS_ENTROPY, (128256, torch.bfloat16))):
        started = time.perf_counter()
        assert check.problem(device, shape) is None, check.name
        first = time.perf_counter() - started
        started = time.perf_counter()
        assert check.problem(device, shape) is None
        print(f"{check.name}: check {first * 1e3:.0f} ms, again "
              f"{(time.perf_counter() - started) * 1e3:.3f} ms")
