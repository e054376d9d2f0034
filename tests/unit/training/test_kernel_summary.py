"""The GPU log names the fused kernels a run uses (so a measured step says what it ran)."""

import torch

from odc_pp.megatron.swiglu import SwiGLU
from odc_pp.training.components import _kernel_summary


class _Chunk(torch.nn.Module):
    def __init__(self, fused_swiglu: bool, fused_rope: bool, fused_ce: bool):
        super().__init__()
        self.act = SwiGLU(fused=fused_swiglu)
        self.fused_rope, self.fused_cross_entropy = fused_rope, fused_ce


def test_summary_names_each_kernel():
    assert _kernel_summary([_Chunk(True, True, True)]) == \
        "swiglu triton, rope triton, cross entropy fused"
    assert _kernel_summary([_Chunk(True, False, False), _Chunk(False, False, False)]) == \
        "swiglu eager, rope megatron, cross entropy unfused"
    assert _kernel_summary([torch.nn.Linear(2, 2)]).startswith("swiglu -")
