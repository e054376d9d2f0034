"""SwiGLU that saves only its input, as Megatron's default fused bias-SwiGLU does.

megatron's unfused ``glu`` (``silu(gate) * up`` under autograd) keeps the fc1 output
*and* ``silu(gate)`` for backward: 3 x ffn bytes per token where 2 x ffn suffice
(7 x s x h bytes per layer more at Llama-3's ffn = 3.5 h). :class:`SwiGLU` keeps the fc1
output and recomputes ``silu(gate)`` in backward, with the same kernels autograd's
backward of the unfused form runs (``silu_backward``, two multiplies), so its gradients
are bitwise those of the unfused form. Plugged in through the layer spec's
``mlp.activation_func`` (megatron builds it when ``use_te_activation_func=True``).

As a child of megatron's ``MLP`` it takes part in ``MLP.sharded_state_dict()`` (the
checkpoint keys of ``dist_checkpointing``): it holds no tensors, so it contributes none;
the MLP itself stores ``linear_fc1`` as ``[gate; up]`` (split per tensor-parallel rank by
megatron's swiglu factory), the layout this module reads.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["SwiGLU", "swiglu", "use_fused_swiglu"]


class _SwiGLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        gate, up = torch.chunk(x, 2, dim=-1)
        ctx.save_for_backward(x)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        gate, up = torch.chunk(x, 2, dim=-1)
        grad_gate = torch.ops.aten.silu_backward(grad_output * up, gate)
        grad_up = grad_output * F.silu(gate)
        return torch.cat([grad_gate, grad_up], dim=-1)


def swiglu(x: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of ``x = [gate | up]`` (last dimension), saving only ``x``."""
    return _SwiGLUFunction.apply(x)


def use_fused_swiglu(setting: str, device: str | torch.device, shape=None) -> bool:
    """``--fused-swiglu``: whether the MLP runs the Triton kernels
    (:mod:`odc_pp.megatron.swiglu_triton`). ``auto``: where they run and match the eager
    path (CUDA with Triton); ``on``: there, else a ValueError saying why not; ``off``.
    ``shape``: ``(ffn per rank, dtype)``, the model's (the check compiles that kernel)."""
    from .kernel_choice import use_kernel
    from .swiglu_triton import FUSED_SWIGLU
    return use_kernel("--fused-swiglu", setting, device, FUSED_SWIGLU, shape)


class SwiGLU(nn.Module):
    """The MLP activation module (``config`` is megatron's TransformerConfig, unused);
    ``fused``: the Triton kernels (:func:`use_fused_swiglu` decided they run here)."""

    def __init__(self, config=None, fused: bool = False) -> None:
        super().__init__()
        self.fused = fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused and x.is_cuda:
            from .swiglu_triton import fused_swiglu
            return fused_swiglu(x)
        return swiglu(x)

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (),
                           metadata: dict | None = None) -> dict:
        """megatron's ``sharded_state_dict`` protocol (``MLP.sharded_state_dict`` asks
        every child): no parameters or buffers, so no checkpoint entries."""
        if self.state_dict():  # a subclass that added state must say how it is sharded
            raise NotImplementedError(f"{type(self).__name__} holds state "
                                      f"{sorted(self.state_dict())}; give it a "
                                      f"sharded_state_dict of its own")
        return {}
