"""SwiGLU as one Triton kernel per direction (``--fused-swiglu``, CUDA).

The eager :class:`~odc_pp.megatron.swiglu.SwiGLU` runs 2 kernels forward and 5 backward
(silu, multiply; multiply, ``silu_backward``, silu, multiply, concatenate), each a full
pass over ``tokens x ffn`` values: 2.06 ms forward + backward for one 8192-token
microbatch at the Llama-3-8B shape on an H200 (``benchmarks/bench_gpu_kernels.py``),
about 4x its memory traffic. Here the forward reads ``[gate | up]`` (megatron's fc1
output, one tensor) and writes ``silu(gate) * up``; the backward reads ``[gate | up]`` and
the output gradient and writes the input gradient in the same ``[gate | up]`` layout. Both
compute in fp32 and round once, so they are at least as close to an fp32 reference as
the eager bf16 chain (``tests/gpu/models/test_swiglu_triton_gpu.py``). What is saved for
backward is the eager function's: the fc1 output alone.

Liger-Kernel's ``LigerSiLUMulFunction`` takes gate and up as two contiguous tensors, so
megatron's fused fc1 output would need two copies in and a concatenation out; this kernel
indexes the halves of the one tensor instead.

The kernels are pure functions of their inputs (no weights), so the B/W split is
untouched. :data:`FUSED_SWIGLU` checks the kernels once per device against the eager path
(:mod:`odc_pp.megatron.kernel_choice`); a failure there keeps the eager path and says why.
"""

from __future__ import annotations

import torch

from .kernel_choice import KernelCheck, compare

__all__ = ["FUSED_SWIGLU", "fused_swiglu"]

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs: the eager path
    triton = None

BLOCK = 1024
"""Columns of one program (a row of the fc1 output is 2 x ffn values)."""

if triton is not None:
    @triton.jit
    def _gate_up(x_ptr, ffn, BLOCK_SIZE: tl.constexpr):
        """This program's row, columns, mask and the fp32 gate and up halves."""
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        mask = cols < ffn
        base = x_ptr + row * 2 * ffn
        gate = tl.load(base + cols, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(base + ffn + cols, mask=mask, other=0.0).to(tl.float32)
        return row, cols, mask, gate, up

    @triton.jit
    def _swiglu_forward(x_ptr, out_ptr, ffn, BLOCK_SIZE: tl.constexpr):
        row, cols, mask, gate, up = _gate_up(x_ptr, ffn, BLOCK_SIZE)
        out = gate * tl.sigmoid(gate) * up
        tl.store(out_ptr + row * ffn + cols, out.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _swiglu_backward(x_ptr, grad_ptr, dx_ptr, ffn, BLOCK_SIZE: tl.constexpr):
        row, cols, mask, gate, up = _gate_up(x_ptr, ffn, BLOCK_SIZE)
        grad = tl.load(grad_ptr + row * ffn + cols, mask=mask, other=0.0).to(tl.float32)
        sig = tl.sigmoid(gate)
        grad_gate = grad * up * sig * (1.0 + gate * (1.0 - sig))
        grad_up = grad * gate * sig
        out = dx_ptr + row * 2 * ffn
        tl.store(out + cols, grad_gate.to(dx_ptr.dtype.element_ty), mask=mask)
        tl.store(out + ffn + cols, grad_up.to(dx_ptr.dtype.element_ty), mask=mask)


def _grid(rows: int, ffn: int) -> tuple[int, int]:
    return rows, triton.cdiv(ffn, BLOCK)


class _FusedSwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x = x.contiguous()
        ffn = x.shape[-1] // 2
        rows = x.numel() // (2 * ffn)
        out = torch.empty(*x.shape[:-1], ffn, dtype=x.dtype, device=x.device)
        if rows:
            _swiglu_forward[_grid(rows, ffn)](x, out, ffn, BLOCK_SIZE=BLOCK)
        ctx.save_for_backward(x)
        return out

    @staticmethod
    def backward(ctx, grad_output):
        (x,) = ctx.saved_tensors
        grad_output = grad_output.contiguous()
        ffn = x.shape[-1] // 2
        rows = x.numel() // (2 * ffn)
        grad_x = torch.empty_like(x)
        if rows:
            _swiglu_backward[_grid(rows, ffn)](x, grad_output, grad_x, ffn, BLOCK_SIZE=BLOCK)
        return grad_x


def fused_swiglu(x: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of ``x = [gate | up]`` (last dimension) by the Triton kernels;
    callers check :data:`FUSED_SWIGLU` first."""
    return _FusedSwiGLU.apply(x)


def _eager(x: torch.Tensor) -> torch.Tensor:
    gate, up = torch.chunk(x, 2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def _check(device: torch.device, shape=None) -> str | None:
    """Forward and backward against the eager formula (in fp32 from the same inputs) at
    ``shape`` = ``(ffn, dtype)``, the model's, so the kernel compiled here is the one the
    step runs (default: ffn 1100, fp32)."""
    ffn, dtype = shape if shape is not None else (1100, torch.float32)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3, 1, 2 * ffn, generator=generator).to(device=device, dtype=dtype)
    grad = torch.randn(3, 1, ffn, generator=generator).to(device=device, dtype=dtype)
    fused_x, eager_x = x.clone().requires_grad_(), x.float().requires_grad_()
    fused_out, eager_out = fused_swiglu(fused_x), _eager(eager_x)
    fused_out.backward(grad)
    eager_out.backward(grad.float())
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    return compare("SwiGLU", (("output", fused_out.float(), eager_out),
                              ("gradient", fused_x.grad.float(), eager_x.grad)), tol=tol)


FUSED_SWIGLU = KernelCheck("SwiGLU", _check)
"""Whether the kernels run on a device (``FUSED_SWIGLU.problem(device)``)."""
