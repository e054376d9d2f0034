"""The fused output layer + loss (odc_pp.megatron.linear_cross_entropy) against the unfused
path: losses, input and weight gradients, with a loss mask, ignored labels and several
chunks (the model-level check: tests/dist/models/test_fused_cross_entropy.py)."""

import pytest
import torch

from odc_pp.megatron import linear_cross_entropy as lce
from odc_pp.testing.saved import saved_bytes


def _unfused(hidden, weight, labels, mask):
    logits = (hidden.transpose(0, 1) @ weight.t()).to(torch.promote_types(hidden.dtype, torch.float32))
    losses = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
    return losses.view_as(labels)


@pytest.mark.parametrize("chunk_bytes", [1 << 30, 4 * 50 * 3])  # one chunk; 3 tokens each
def test_losses_and_gradients_match_unfused(monkeypatch, chunk_bytes):
    monkeypatch.setattr(lce, "CHUNK_LOGIT_BYTES", chunk_bytes)
    torch.manual_seed(0)
    seq, batch, h, vocab = 7, 2, 16, 50
    hidden = torch.randn(seq, batch, h, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(vocab, h, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, vocab, (batch, seq))
    labels[1, 2] = lce.IGNORE_INDEX
    mask = (torch.rand(batch, seq) > 0.3).double()
    scale = 0.37  # the runtime's loss: sum(mask * losses) * scale
    grads = []
    for fn in (_unfused, lce.linear_cross_entropy):
        losses = fn(hidden, weight, labels, mask)
        ((losses * mask).sum() * scale).backward()
        grads.append((losses.detach(), hidden.grad.clone(), weight.grad.clone()))
        hidden.grad = weight.grad = None
    for ref, got in zip(grads[0], grads[1]):
        torch.testing.assert_close(got.double(), ref.double(), rtol=1e-10, atol=1e-12)


def test_no_gradient_work_without_grad():
    hidden, weight = torch.randn(4, 1, 8), torch.randn(10, 8)
    labels = torch.randint(0, 10, (1, 4))
    with torch.no_grad():
        losses = lce.linear_cross_entropy(hidden, weight, labels)
    torch.testing.assert_close(losses, _unfused(hidden, weight, labels, None))


def test_choice_and_chunk_formula():
    assert lce.use_fused_cross_entropy("auto", "cpu") is False
    assert lce.use_fused_cross_entropy("auto", "cuda:0") is True
    assert lce.use_fused_cross_entropy("on", "cpu", tensor_parallel=2) is False
    with pytest.raises(ValueError, match="fused cross entropy"):
        lce.use_fused_cross_entropy("liger", "cpu")
    # the Llama-3-8B shape: 2048 tokens of fp32 logits per chunk (2093 fit in 1 GiB)
    assert lce.chunk_tokens(8192, 128256) == 2048
    assert lce.chunk_tokens(8192, 1 << 30) == 1
    assert lce.chunk_tokens(3, 128256) == 3


def test_held_bytes_formula_is_what_backward_keeps():
    """What F leaves for B (Gx, GW, the token weights; the losses are the output) is
    held_bytes' formula (bf16 compute and weights: 2 bytes each)."""
    tokens, h, vocab = 12, 16, 40
    hidden = torch.randn(tokens, 1, h, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(vocab, h, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (1, tokens))
    kept = saved_bytes(lce.linear_cross_entropy, hidden, weight, labels)
    # token weights fp32 (4 bytes a token); the formula's 8 per token also covers the
    # fp32 losses the caller holds
    assert kept + 4 * tokens == lce.held_bytes(tokens, h, vocab, 2, 2)


def test_host_loss_mask_moves_without_blocking():
    """The loss mask comes from the host (the runtime keeps microbatches on the CPU): its
    copy to the device is non_blocking, since a blocking one synchronises the stream inside
    F (the GPU sync test of issue 29 failed there). Shown with the model on the meta
    device: every host-to-device copy of the call is recorded."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from odc_pp.megatron.linear_cross_entropy import linear_cross_entropy

    class Copies(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.blocking = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is torch.ops.aten._to_copy.default and args[0].device.type == "cpu" \
                    and kwargs.get("device") not in (None, torch.device("cpu")) \
                    and not kwargs.get("non_blocking", False):
                self.blocking.append(tuple(args[0].shape))
            return func(*args, **kwargs)

    hidden = torch.randn(16, 2, 8, device="meta")
    weight = torch.randn(32, 8, device="meta")
    labels = torch.randint(0, 32, (2, 16), device="meta")
    mask = torch.ones(2, 16)
    with Copies() as copies:
        linear_cross_entropy(hidden, weight, labels, mask)
    assert copies.blocking == []
