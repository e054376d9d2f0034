"""GQA-native varlen flash attention on a torch whose ``varlen_attn`` has no ``enable_gqa``
(torch 2.11, the lent machines'; issue 50).

torch's ``varlen_attn`` calls ``aten._flash_attention_forward`` / ``_backward``, whose
flash kernels take fewer K/V heads than query heads (each K/V head serves
``heads / groups`` query heads; the backward sums the K/V gradients of a group). Only the
Python wrapper of torch 2.11 refuses it, so the previous code repeated K and V to the
query heads (``repeat_interleave``: two copies of ``tokens x heads x dim`` per layer and
their gradients summed back). :class:`FlashVarlenGQA` calls the two aten ops itself with
the K/V heads as they are.

:func:`gqa_flash_problem` checks it once per device against the repeated-heads call
(forward and backward, a few hundred tokens); where it fails the caller keeps the
repeated heads and says why.
"""

from __future__ import annotations

import functools
import inspect

import torch

__all__ = ["FlashVarlenGQA", "aten_flash_ops", "flash_varlen_gqa", "gqa_flash_problem"]


def aten_flash_ops():
    """``(forward, backward)`` aten flash ops, or None where this torch has none."""
    forward = getattr(torch.ops.aten, "_flash_attention_forward", None)
    backward = getattr(torch.ops.aten, "_flash_attention_backward", None)
    try:
        forward.default, backward.default  # noqa: B018 - resolves the overloads
    except (AttributeError, RuntimeError):
        return None
    return forward, backward


class FlashVarlenGQA(torch.autograd.Function):
    """Causal varlen flash attention of ``q [tokens, heads, d]`` over ``k, v [tokens,
    groups, d]`` (``heads % groups == 0``) with the flash ops ``ops``."""

    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens, max_seqlen, scale, ops):  # noqa: D401
        forward, _ = ops
        out, lse, rng_state, unused, _ = forward(
            q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, 0.0, True, False,
            scale=scale)
        ctx.save_for_backward(q, k, v, out, lse, cu_seqlens, rng_state, unused)
        ctx.max_seqlen, ctx.scale, ctx.ops = max_seqlen, scale, ops
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, cu_seqlens, rng_state, unused = ctx.saved_tensors
        _, backward = ctx.ops
        dq, dk, dv = backward(grad_out.contiguous(), q, k, v, out, lse, cu_seqlens, cu_seqlens,
                              ctx.max_seqlen, ctx.max_seqlen, 0.0, True, rng_state, unused,
                              scale=ctx.scale)
        return dq, dk, dv, None, None, None, None


def flash_varlen_gqa(q, k, v, cu_seqlens, max_seqlen, scale, *, ops=None):
    """The varlen backend's call signature; ``ops`` default :func:`aten_flash_ops`."""
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"query heads {q.shape[1]} are not a multiple of the K/V heads "
                         f"{k.shape[1]}")
    return FlashVarlenGQA.apply(q, k, v, cu_seqlens, int(max_seqlen), float(scale),
                                ops or aten_flash_ops())


def _repeated(varlen_attn, q, k, v, cu_seqlens, max_seqlen, scale):
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    params = inspect.signature(varlen_attn).parameters
    kwargs = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    if "scale" in params:
        kwargs["scale"] = scale
    return varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, **kwargs)


@functools.lru_cache(maxsize=None)
def gqa_flash_problem(device: str) -> str | None:
    """None where :func:`flash_varlen_gqa` runs on ``device`` and matches torch's
    ``varlen_attn`` with repeated K/V heads (bf16, three documents, 8 heads / 2 groups,
    head dim 128), else why not."""
    if aten_flash_ops() is None:
        return "this torch has no aten flash attention ops"
    if not device.startswith("cuda"):
        return f"flash attention needs a CUDA device, not {device}"
    try:
        from torch.nn.attention.varlen import varlen_attn

        generator = torch.Generator().manual_seed(0)
        tokens, dim = 300, 128
        q, k, v, grad = (torch.randn(tokens, heads, dim, generator=generator).to(
            device=device, dtype=torch.bfloat16) for heads in (8, 2, 2, 8))
        cu = torch.tensor([0, 100, 250, 300], dtype=torch.int32, device=device)
        results = []
        for fn in (flash_varlen_gqa, functools.partial(_repeated, varlen_attn)):
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            out = fn(*leaves, cu, 150, dim ** -0.5)
            out.backward(grad)
            results.append([out.float(), *(t.grad.float() for t in leaves)])
        for label, got, want in zip(("output", "dq", "dk", "dv"), *results):
            if not torch.allclose(got, want, rtol=2e-2, atol=2e-2):
                return (f"GQA flash varlen's {label} differs from the repeated-heads call by "
                        f"{(got - want).abs().max().item():.3g}")
    except Exception as exc:  # noqa: BLE001 - any failure keeps the repeated heads
        return f"GQA flash varlen failed: {type(exc).__name__}: {exc}"[:300]
    return None
