"""The chunk cross entropy computed in the logits buffer (odc_pp.megatron.cross_entropy_inplace,
issue 50): the same loss and gradient as the previous fp32 log-softmax path in fp32 and
bf16, no fp32 tensor the size of the chunk, and the Triton kernel (under Triton's CPU
interpreter where Triton is installed) against the torch path."""

from __future__ import annotations

import os
import subprocess
import sys
import importlib.util

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from odc_pp.megatron import cross_entropy_inplace as cei
from odc_pp.megatron import linear_cross_entropy as lce
from odc_pp.megatron.kernel_choice import KernelCheck

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))


def _previous(logits, target):
    """The previous chunk code: an fp32 log-softmax of the logits, exp_, minus one-hot,
    cast back."""
    logp = torch.log_softmax(logits, dim=1,
                             dtype=torch.promote_types(logits.dtype, torch.float32))
    loss = logp.gather(1, target.unsqueeze(1)).squeeze(1).neg()
    probs = logp.exp_()
    probs.scatter_add_(1, target.unsqueeze(1),
                       torch.full_like(target.unsqueeze(1), -1, dtype=probs.dtype))
    return loss, probs.to(logits.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block", [cei.BLOCK_ELEMENTS, 3 * 301])  # one block; 3 rows each
def test_in_place_matches_the_previous_path(monkeypatch, dtype, block):
    monkeypatch.setattr(cei, "BLOCK_ELEMENTS", block)
    generator = torch.Generator().manual_seed(1)
    logits = (6 * torch.randn(10, 301, generator=generator)).to(dtype)
    target = torch.randint(0, 301, (10,), generator=generator)
    ref_loss, ref_grad = _previous(logits, target)
    work = logits.clone()
    loss = cei.softmax_grad_(work, target, want_grad=True)
    assert loss.dtype == torch.float32 and work.dtype == dtype
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-5)
    # the gradient is rounded once to the logits' dtype in both: at most one ulp apart
    torch.testing.assert_close(work.float(), ref_grad.float(), rtol=0,
                               atol=1e-6 if dtype == torch.float32 else 2 ** -8)
    untouched = logits.clone()
    torch.testing.assert_close(cei.softmax_grad_(untouched, target, want_grad=False), loss)
    assert torch.equal(untouched, logits)


class _Fp32Sizes(TorchDispatchMode):
    """The element count of every fp32 tensor an op makes."""

    def __init__(self):
        super().__init__()
        self.sizes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(tensor, torch.Tensor) and tensor.dtype == torch.float32:
                self.sizes.append(tensor.numel())
        return out


def test_bf16_chunk_makes_no_fp32_copy_of_its_logits(monkeypatch):
    """Forward and backward of the fused layer on bf16 make no fp32 tensor of a chunk's
    logits' size (the previous path's log_softmax made one per chunk)."""
    monkeypatch.setattr(cei, "BLOCK_ELEMENTS", 4 * 97)
    tokens, h, vocab = 64, 8, 97
    hidden = torch.randn(tokens, 1, h, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(vocab, h, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (1, tokens))
    with _Fp32Sizes() as seen:
        losses = lce.linear_cross_entropy(hidden, weight, labels)
        losses.float().sum().backward()
    assert lce.chunk_tokens(tokens, vocab) == tokens  # one chunk: 64 x 97 logits
    assert max(seen.sizes) <= 4 * vocab, max(seen.sizes)
    assert hidden.grad is not None and weight.grad is not None


def test_the_check_runs_once_per_real_shape(monkeypatch):
    """A check handed the real shape compiles that one: it sees the shape, once."""
    seen = []
    check = KernelCheck("x", lambda device, shape: seen.append(shape))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    for _ in range(3):
        assert check.problem(torch.device("cuda:0"), (128256, torch.bfloat16)) is None
    assert seen == [(128256, torch.bfloat16)]


_KERNEL_SCRIPT = """
import torch
from odc_pp.megatron import cross_entropy_inplace as cei
for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2 ** -8)):
    for vocab in (301, 5000):  # under one Triton block; several blocks, a ragged tail
        logits = (6 * torch.randn(4, vocab)).to(dtype)
        target = torch.randint(0, vocab, (4,))
        fused, eager = logits.clone(), logits.clone()
        loss = cei.softmax_grad_triton_(fused, target, True)
        ref = cei.softmax_grad_torch_(eager, target, True)
        torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(fused.float(), eager.float(), rtol=0, atol=tol)
        plain = logits.clone()
        torch.testing.assert_close(cei.softmax_grad_triton_(plain, target, False), loss)
        assert torch.equal(plain, logits)
print("kernel ok")
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton not installed")
def test_triton_kernel_matches_the_torch_path_in_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(
        [ROOT, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", _KERNEL_SCRIPT], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
