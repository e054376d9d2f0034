"""One token chunk's cross entropy computed in its logits buffer, with no fp32 copy of the
logits (issue 50): the per-row loss in fp32 and, in place of the logits, their gradient
``softmax(z) - onehot(y)`` rounded to the logits' dtype.

The first fused version ran ``log_softmax(z_bf16, dtype=fp32)`` (an fp32 copy of the
chunk), ``exp_`` on it and a cast back: about 22 bytes of traffic per logit. Here:

* **Triton** (CUDA, :data:`INPLACE_CROSS_ENTROPY` checked once per device *at the real
  vocabulary and dtype*, so the check compiles the kernel the step runs): one program per
  row reads the row twice in the logits' dtype, an online max / sum of exponentials in
  fp32 and then ``exp(z - lse) - onehot`` written over the row: 6 bytes per bf16 logit.
* **torch** (CPU, or CUDA where the kernel cannot run): blocks of rows at most
  :data:`BLOCK_ELEMENTS` logits are lifted to fp32 (a bounded transient, not the chunk),
  ``logsumexp`` and the gradient computed there and written back into the block; fp32
  logits are worked on in place.

Both give the values of the previous code: the loss ``logsumexp(z) - z[y]`` in fp32 from
the logits as the GEMM rounded them, the gradient rounded once to the logits' dtype.
Rows whose label the caller ignores get ``target`` 0 here; the caller masks them.
"""

from __future__ import annotations

import torch

from .kernel_choice import KernelCheck, compare

__all__ = ["BLOCK_ELEMENTS", "INPLACE_CROSS_ENTROPY", "softmax_grad_",
           "softmax_grad_torch_", "softmax_grad_triton_"]

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs: the torch path
    triton = None

BLOCK_ELEMENTS = 1 << 24
"""Logits lifted to fp32 at a time by the torch path (64 MiB of fp32)."""
TRITON_BLOCK = 4096
"""Columns one Triton program handles per step of its loop over the row."""

if triton is not None:
    @triton.jit
    def _row_cross_entropy(z_ptr, target_ptr, loss_ptr, vocab, stride,
                           WANT_GRAD: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        base = z_ptr + row * stride
        cols = tl.arange(0, BLOCK)
        peak = float("-inf")
        total = 0.0
        for start in range(0, vocab, BLOCK):
            mask = start + cols < vocab
            z = tl.load(base + start + cols, mask=mask, other=float("-inf")).to(tl.float32)
            new_peak = tl.maximum(peak, tl.max(z, 0))
            total = total * tl.exp(peak - new_peak) + tl.sum(tl.exp(z - new_peak), 0)
            peak = new_peak
        lse = peak + tl.log(total)
        target = tl.load(target_ptr + row)
        picked = tl.load(base + target).to(tl.float32)
        tl.store(loss_ptr + row, lse - picked)
        if WANT_GRAD:
            for start in range(0, vocab, BLOCK):
                mask = start + cols < vocab
                z = tl.load(base + start + cols, mask=mask, other=0.0).to(tl.float32)
                grad = tl.exp(z - lse) - tl.where(start + cols == target, 1.0, 0.0)
                tl.store(base + start + cols, grad.to(z_ptr.dtype.element_ty), mask=mask)


def softmax_grad_triton_(logits: torch.Tensor, target: torch.Tensor,
                         want_grad: bool) -> torch.Tensor:
    """The Triton kernel: per-row fp32 loss; ``logits`` (rows contiguous) become the
    gradient when ``want_grad``."""
    rows, vocab = logits.shape
    losses = torch.empty(rows, dtype=torch.float32, device=logits.device)
    if rows:
        _row_cross_entropy[(rows,)](logits, target, losses, vocab, logits.stride(0),
                                    WANT_GRAD=want_grad,
                                    BLOCK=min(TRITON_BLOCK, triton.next_power_of_2(vocab)))
    return losses


def softmax_grad_torch_(logits: torch.Tensor, target: torch.Tensor,
                        want_grad: bool) -> torch.Tensor:
    """The torch path: row blocks of at most :data:`BLOCK_ELEMENTS` logits in fp32."""
    rows, vocab = logits.shape
    fp32 = torch.promote_types(logits.dtype, torch.float32)
    losses = torch.empty(rows, dtype=fp32, device=logits.device)
    step = max(1, BLOCK_ELEMENTS // max(vocab, 1))
    for start in range(0, rows, step):
        block = logits[start:start + step]
        picked = target[start:start + step].unsqueeze(1)
        work = block if block.dtype == fp32 else block.to(fp32)
        lse = torch.logsumexp(work, dim=1)
        losses[start:start + step] = lse - work.gather(1, picked).squeeze(1)
        if want_grad:
            work.sub_(lse.unsqueeze(1)).exp_()
            work.scatter_add_(1, picked, torch.full_like(picked, -1, dtype=fp32))
            if work is not block:
                block.copy_(work)
    return losses


def softmax_grad_(logits: torch.Tensor, target: torch.Tensor,
                  want_grad: bool) -> torch.Tensor:
    """Per-row loss ``logsumexp(z) - z[target]`` (fp32 or wider); with ``want_grad``,
    ``logits`` ``[rows, vocab]`` now hold ``softmax(z) - onehot(target)``. The Triton
    kernel where :data:`INPLACE_CROSS_ENTROPY` passed for this device, vocabulary and
    dtype, else the torch path."""
    if logits.is_cuda and logits.stride(1) == 1 and logits.dtype != torch.float64 and \
            INPLACE_CROSS_ENTROPY.problem(logits.device,
                                          shape=(logits.shape[1], logits.dtype)) is None:
        return softmax_grad_triton_(logits, target, want_grad)
    return softmax_grad_torch_(logits, target, want_grad)


def _check(device: torch.device, shape=None) -> str | None:
    """The kernel against the torch path on a few rows of the real vocabulary and dtype
    (``shape``: ``(vocab, dtype)``; the same compiled kernel the step runs)."""
    vocab, dtype = shape if shape is not None else (50_000, torch.bfloat16)
    generator = torch.Generator().manual_seed(0)
    logits = (4 * torch.randn(5, vocab, generator=generator)).to(device=device, dtype=dtype)
    target = torch.randint(0, vocab, (5,), generator=generator).to(device)
    fused, eager = logits.clone(), logits.clone()
    fused_loss = softmax_grad_triton_(fused, target, True)
    eager_loss = softmax_grad_torch_(eager, target, True)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    return compare("cross entropy", (("loss", fused_loss, eager_loss.float()),
                                     ("gradient", fused.float(), eager.float())), tol=tol)


INPLACE_CROSS_ENTROPY = KernelCheck("cross entropy", _check)
"""Whether the in-place Triton kernel runs on a device, per (vocabulary, dtype)."""
