"""Rotary position embedding as one Triton kernel per direction (``--fused-rope``, CUDA).

Megatron's unfused RoPE (``_apply_rotary_pos_emb_bshd``, what runs without Transformer
Engine) takes ``cos`` and ``sin`` of the angles in every layer and runs ``t * cos +
rotate_half(t) * sin`` as five kernels forward and as many backward: 1.31 ms per layer
and microbatch for q and k at the Llama-3-8B shape on an H200
(``benchmarks/bench_gpu_kernels.py``), 42 ms of a 1.18 s step. Here ``cos`` and ``sin``
are computed once per microbatch in fp32 (:class:`RotaryInAttention`), and one kernel
reads ``t`` and writes ``t * cos + rotate_half(t) * sin`` (fp32 inside, one rounding);
backward applies the inverse rotation to the gradient. Non-interleaved rotation over the
whole head (megatron's layout of the angles: the same angles on both halves).

Placement: the rotation moves from megatron's ``SelfAttention`` into odc-pp's SDPA core
attention (:class:`~odc_pp.megatron.compat.SdpaDotProductAttention`): the model hands
megatron no rotary embedding and wraps the attention mask in :class:`RotaryInAttention`,
which the core attention unwraps -- a ModuleSpec extension, nothing patched. The
rotation has no weights, so the B/W split is untouched. :data:`FUSED_ROPE` checks the
kernels once per device against the eager formula (:mod:`odc_pp.megatron.kernel_choice`);
where they fail, the model keeps megatron's path.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .kernel_choice import KernelCheck, compare, use_kernel

__all__ = ["FUSED_ROPE", "RotaryInAttention", "eager_rope", "fused_rope", "use_fused_rope"]

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs: megatron's path
    triton = None

if triton is not None:
    @triton.jit
    def _rope_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, batch, heads, half,
                     x_stride_s, x_stride_b, x_stride_n, c_stride_s, c_stride_b,
                     SIGN: tl.constexpr, BLOCK: tl.constexpr):
        s = tl.program_id(0).to(tl.int64)
        b = tl.program_id(1).to(tl.int64)
        n = tl.program_id(2).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < half
        x = x_ptr + s * x_stride_s + b * x_stride_b + n * x_stride_n
        x1 = tl.load(x + cols, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x + half + cols, mask=mask, other=0.0).to(tl.float32)
        c_offset = s * c_stride_s + b * c_stride_b + cols
        cos = tl.load(cos_ptr + c_offset, mask=mask, other=0.0)
        sin = tl.load(sin_ptr + c_offset, mask=mask, other=0.0) * SIGN
        out = out_ptr + ((s * batch + b) * heads + n) * 2 * half
        tl.store(out + cols, (x1 * cos - x2 * sin).to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(out + half + cols, (x2 * cos + x1 * sin).to(out_ptr.dtype.element_ty),
                 mask=mask)


def _rotate(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sign: float) -> torch.Tensor:
    """``t`` ``[s, b, n, d]`` (last dimension contiguous) rotated by the angles whose cos
    and sin are ``[s, b or 1, d / 2]`` (fp32); ``sign`` -1: the inverse rotation."""
    if t.stride(-1) != 1:
        t = t.contiguous()
    seq, batch, heads, dim = t.shape
    out = torch.empty(seq, batch, heads, dim, dtype=t.dtype, device=t.device)
    if t.numel():
        c_stride_b = cos.stride(1) if cos.shape[1] > 1 else 0
        _rope_kernel[(seq, batch, heads)](
            t, cos, sin, out, batch, heads, dim // 2, t.stride(0), t.stride(1), t.stride(2),
            cos.stride(0), c_stride_b, SIGN=sign, BLOCK=triton.next_power_of_2(dim // 2))
    return out


class _FusedRope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _rotate(t, cos, sin, 1.0)

    @staticmethod
    def backward(ctx, grad_output):
        cos, sin = ctx.saved_tensors
        return _rotate(grad_output, cos, sin, -1.0), None, None


def fused_rope(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Megatron's non-interleaved RoPE of ``t`` ``[s, b, n, d]`` by the Triton kernel;
    ``cos``/``sin``: :meth:`RotaryInAttention.cos_sin`."""
    return _FusedRope.apply(t, cos, sin)


@dataclass
class RotaryInAttention:
    """The attention mask (None, a boolean mask or ``PackedSegments``) with the rotary
    embedding the core attention applies to queries and keys (megatron's
    ``[s, b or 1, 1, d]`` fp32 angles, both halves equal)."""

    mask: object
    freqs: torch.Tensor
    _cos_sin: tuple | None = field(default=None, repr=False)

    def cos_sin(self) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 ``cos`` and ``sin`` ``[s, b or 1, d / 2]``, computed once per microbatch and
        held by it (2 x s x b' x d/2 x 4 bytes: 4 MiB at s 8192, b' 1, d 128; megatron's
        path makes the same tensors in every layer, transiently)."""
        if self._cos_sin is None:
            half = self.freqs.shape[-1] // 2
            angles = self.freqs[:, :, 0, :half].float()
            self._cos_sin = (torch.cos(angles).contiguous(), torch.sin(angles).contiguous())
        return self._cos_sin

    def apply(self, query: torch.Tensor, key: torch.Tensor):
        """``(query, key)`` rotated (``[s, b, heads, d]`` each). The kernel rotates the
        whole head: a rotary embedding narrower than it (megatron's ``rotary_percent`` <
        1, which odc-pp never sets) is an error, not a wrong rotation."""
        if self.freqs.shape[-1] != query.shape[-1] or self.freqs.shape[-1] != key.shape[-1]:
            raise ValueError(f"--fused-rope rotates whole heads: rotary width "
                             f"{self.freqs.shape[-1]}, head dims {query.shape[-1]} / "
                             f"{key.shape[-1]}; use --fused-rope off")
        cos, sin = self.cos_sin()
        return fused_rope(query, cos, sin), fused_rope(key, cos, sin)


def eager_rope(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Megatron's unfused formula (``t * cos + rotate_half(t) * sin`` with ``cos``/``sin``
    of the fp32 angles in ``t``'s dtype): the reference of the check and the tests."""
    cos, sin = torch.cos(freqs).to(t.dtype), torch.sin(freqs).to(t.dtype)
    first, second = torch.chunk(t, 2, dim=-1)
    return t * cos + torch.cat((-second, first), dim=-1) * sin


def _check(device: torch.device, shape=None) -> str | None:
    """Forward and backward against :func:`eager_rope` (in fp32 from the same inputs):
    per-row angles, for query and key heads. ``shape``: ``(heads, groups, dim, dtype)``,
    the model's, so the kernels compiled here are the ones the step runs (default: 3 and
    1 heads of dim 48, not a power of two, fp32)."""
    heads, groups, dim, dtype = shape if shape is not None else (3, 1, 48, torch.float32)
    generator = torch.Generator().manual_seed(0)
    seq, batch = 37, 1
    positions = torch.randint(0, 4096, (seq, batch, 1, dim // 2), generator=generator)
    angles = (positions * 0.37).float().to(device)
    freqs = torch.cat((angles, angles), dim=-1)
    cos_sin = RotaryInAttention(None, freqs).cos_sin()
    pairs, tol = [], 1e-4 if dtype == torch.float32 else 2e-2
    for count in dict.fromkeys((heads, groups)):
        t = torch.randn(seq, batch, count, dim, generator=generator).to(device=device,
                                                                        dtype=dtype)
        grad = torch.randn(seq, batch, count, dim, generator=generator).to(device=device,
                                                                           dtype=dtype)
        fused_t, eager_t = t.clone().requires_grad_(), t.float().requires_grad_()
        fused_out, eager_out = fused_rope(fused_t, *cos_sin), eager_rope(eager_t, freqs)
        fused_out.backward(grad)
        eager_out.backward(grad.float())
        pairs += [(f"output ({count} heads)", fused_out.float(), eager_out),
                  (f"gradient ({count} heads)", fused_t.grad.float(), eager_t.grad)]
    return compare("RoPE", pairs, tol=tol)


FUSED_ROPE = KernelCheck("RoPE", _check)
"""Whether the kernels run on a device (``FUSED_ROPE.problem(device)``)."""


def use_fused_rope(setting: str, device: str | torch.device, shape=None) -> bool:
    """``--fused-rope``: ``auto`` where the kernels run (CUDA with Triton), ``on`` there
    or a ValueError saying why not, ``off`` never."""
    return use_kernel("--fused-rope", setting, device, FUSED_ROPE, shape)
