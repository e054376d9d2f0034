"""RMSNorm that keeps for backward what a fused kernel keeps: its input (compute dtype)
and the fp32 reciprocal RMS per token.

On CUDA, ``F.rms_norm`` runs torch's fused kernel, which saves exactly that. On the CPU
it decomposes into fp32 operations whose autograd keeps the upcast input and the
normalised output in fp32: 8 more bytes per token x hidden per norm than on the GPU, so
the memory dry run (fake CPU tensors) over-counted a GPU's activations by 16 x s x h
bytes per layer. :class:`RMSNorm` computes the same forward (bitwise: the decomposition's
own operations) and, on the CPU, a backward from the saved input and reciprocal RMS;
the gradients agree with autograd's to fp32 rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["RMSNorm", "RMSNorm1P", "rms_norm"]


def _normalise(x32: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)


class _RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, offset):
        x32 = x.float()
        rstd = _normalise(x32, eps)
        gamma = weight + offset if offset else weight
        ctx.save_for_backward(x, rstd, weight)
        ctx.offset = offset
        return (x32 * rstd * gamma).to(x.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        x, rstd, weight = ctx.saved_tensors
        gamma = (weight + ctx.offset if ctx.offset else weight).float()
        normed = x.float() * rstd
        grad = grad_output.float()
        grad_weight = None
        if ctx.needs_input_grad[1]:
            grad_weight = (grad * normed).reshape(-1, normed.shape[-1]).sum(0).to(weight.dtype)
        grad_normed = grad * gamma
        grad_x = rstd * (grad_normed - normed * (grad_normed * normed).mean(-1, keepdim=True))
        return grad_x.to(x.dtype), grad_weight, None, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float | None,
             offset: float = 0.0) -> torch.Tensor:
    """``F.rms_norm(x, (h,), weight + offset, eps)`` over the last dimension, saving only
    ``x`` and the reciprocal RMS for backward (module docstring)."""
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    if x.is_cuda or not torch.is_grad_enabled():
        return F.rms_norm(x, (x.shape[-1],), weight + offset if offset else weight, eps)
    return _RMSNormFunction.apply(x, weight, eps, offset)


class RMSNorm(torch.nn.RMSNorm):
    """``torch.nn.RMSNorm`` (one learned weight over the last dimension) through
    :func:`rms_norm`."""

    offset = 0.0

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002
        if self.weight is None or len(self.normalized_shape) != 1:
            return super().forward(input)
        return rms_norm(input, self.weight, self.eps, self.offset)


class RMSNorm1P(RMSNorm):
    """:class:`RMSNorm` with a zero-centred weight (Megatron's ``--apply-layernorm-1p``;
    Transformer Engine's RMSNorm under ``zero_centered_gamma``): the stored weight starts
    at 0 and the output is scaled by ``1 + weight``."""

    offset = 1.0

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if self.weight is not None:
            torch.nn.init.zeros_(self.weight)
