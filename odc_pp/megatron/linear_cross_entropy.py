"""The output layer and the token cross entropy in one pass over token chunks, never
holding the ``tokens x vocabulary`` logits (``--fused-cross-entropy``).

The unfused last stage materialises the logits ``[b, s, V]`` in the compute dtype, a
transposed copy, an fp32 copy and the log-softmax saved for backward: at the Llama-3-8B
shape (s 8192, V 128256) about 12 GB per microbatch and ~46 bytes of memory traffic per
logit. :func:`linear_cross_entropy` walks the tokens in chunks of
:func:`chunk_tokens` rows (each chunk's fp32 logits at most :data:`CHUNK_LOGIT_BYTES`) and,
when a gradient is wanted, computes it in the same pass, as Liger Kernel's fused linear
cross entropy does:

* per token ``t``: ``loss_t = logsumexp(z_t) - z_t[y_t]`` with ``z_t = W x_t`` in fp32;
* ``d_t = softmax(z_t) - onehot(y_t)`` (rounded to the compute dtype, as the unfused
  path's logits gradient is), then ``Gx_t = d_t W`` and ``GW = sum_t w_t d_t^T x_t``,
  where ``w`` are the token weights the caller will apply (the loss mask); ``GW`` is
  accumulated chunk by chunk in the weight's dtype (as Liger's is).

Backward then costs two element-wise products. Where the weight has an fp32 ``main_grad``
(the data-parallel engine's ``grad_accumulation`` 'local'), the second is
``main_grad += c GW`` in one pass, computed in ``main_grad``'s dtype, and no weight
gradient is returned: no bf16 ``.grad`` of ``V x h`` is written, then read and added by
the engine's hook (issue 50). ``c`` is only known in B, so ``GW`` itself is summed over
the chunks in F as before. The input gradient is exact for any
incoming per-token gradient ``g`` (``g_t Gx_t``). The weight gradient is ``c GW``, which
is the true ``sum_t g_t d_t^T x_t`` when ``g = c w``: the runtime's loss is
``sum_t(w_t loss_t) * scale / tokens`` (:meth:`odc_pp.runtime.runtime.PipelineRuntime.
_scaled_loss`), so it always is; ``c`` is recovered on the device (no host sync).

What it gives up: the output layer's weight gradient is computed in F, not deferred to W
(the zero-bubble schedules' W of the last stage is then only the decoder's), and held
from F to B in the weight's dtype (``V x h`` elements: :func:`held_bytes`). Tensor
parallelism (vocab-parallel logits) keeps the unfused path.

Memory per microbatch, F to B: ``Gx`` (``tokens x h``, compute dtype) + ``GW`` (``V x h``,
weight dtype) + the per-token loss and weight; transient inside F: one chunk's logits in
the compute dtype, their gradient written over them (no fp32 copy: :mod:`odc_pp.megatron.
cross_entropy_inplace`; :func:`chunk_tokens`).
"""

from __future__ import annotations

import torch

from ..data.pinned import to_device
from .cross_entropy_inplace import softmax_grad_

__all__ = ["FUSED_CROSS_ENTROPY", "CHUNK_LOGIT_BYTES", "chunk_tokens", "chunk_transient_bytes",
           "held_bytes", "warm_cross_entropy",
           "linear_cross_entropy", "use_fused_cross_entropy"]

FUSED_CROSS_ENTROPY = ("auto", "on", "off")
"""``--fused-cross-entropy``: auto (on for CUDA, off on CPU), on, off."""
CHUNK_LOGIT_BYTES = 1 << 30
"""Upper bound on one chunk's fp32 logits (the transient of F)."""
IGNORE_INDEX = -100
"""Labels with this value contribute no loss and no gradient (torch's default)."""


def use_fused_cross_entropy(setting: str, device: str | torch.device, *,
                            tensor_parallel: int = 1) -> bool:
    """Whether the last stage fuses its output layer with the loss: ``on`` anywhere,
    ``auto`` on CUDA; never under tensor parallelism (vocab-parallel logits)."""
    if setting not in FUSED_CROSS_ENTROPY:
        raise ValueError(f"fused cross entropy must be one of {FUSED_CROSS_ENTROPY}, "
                         f"got {setting!r}")
    if tensor_parallel > 1 or setting == "off":
        return False
    return setting == "on" or torch.device(device).type == "cuda"


def chunk_tokens(tokens: int, vocab: int) -> int:
    """Tokens per chunk: as many as keep one chunk's fp32 logits within
    :data:`CHUNK_LOGIT_BYTES`, rounded down to a multiple of 256 when that many fit (GEMM
    tiles), at least one, at most all."""
    fit = max(1, CHUNK_LOGIT_BYTES // (4 * vocab))
    if fit >= 256:
        fit -= fit % 256
    return min(tokens, fit)


def chunk_transient_bytes(tokens: int, vocab: int, compute_bytes: int) -> int:
    """Bytes of one chunk's logits inside F: the logits in the compute dtype (their
    gradient is written over them) and, on the torch path, one fp32 row block
    (:data:`~odc_pp.megatron.cross_entropy_inplace.BLOCK_ELEMENTS` at most)."""
    from .cross_entropy_inplace import BLOCK_ELEMENTS
    logits = vocab * chunk_tokens(tokens, vocab)
    return compute_bytes * logits + 4 * min(BLOCK_ELEMENTS, logits)


def warm_cross_entropy(weight: torch.Tensor) -> str | None:
    """Check (and so compile) the in-place kernel at the output layer's real vocabulary
    and dtype at build time, not in the first iteration; None where it runs."""
    from .cross_entropy_inplace import INPLACE_CROSS_ENTROPY
    if weight.device.type != "cuda":
        return "not on CUDA"
    return INPLACE_CROSS_ENTROPY.problem(weight.device, (weight.shape[0], weight.dtype))


def held_bytes(tokens: int, hidden: int, vocab: int, compute_bytes: int,
               weight_bytes: int) -> int:
    """Bytes one microbatch holds from F to B: ``Gx`` + ``GW`` + fp32 loss and weight."""
    return tokens * hidden * compute_bytes + vocab * hidden * weight_bytes + 8 * tokens


def _chunk(x: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
           want_grad: bool):
    """Loss of one chunk and, if wanted, ``d`` (softmax - onehot) in the compute dtype,
    written over the chunk's logits (:func:`~odc_pp.megatron.cross_entropy_inplace.
    softmax_grad_`: no fp32 copy of the logits); rows of ignored labels are left to the
    caller's row weights."""
    valid = labels != IGNORE_INDEX
    target = labels.masked_fill(~valid, 0)
    logits = x @ weight.t()
    loss = softmax_grad_(logits, target, want_grad).masked_fill_(~valid, 0.0)
    return loss, (logits if want_grad else None), valid


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, labels, token_weights):  # noqa: D401
        want_grad = x.requires_grad or weight.requires_grad
        tokens = x.shape[0]
        step = chunk_tokens(tokens, weight.shape[0])
        losses = torch.empty(tokens, dtype=torch.promote_types(x.dtype, torch.float32),
                             device=x.device)
        grad_x = torch.empty_like(x) if want_grad else None
        grad_w = None
        for start in range(0, tokens, step):
            rows = slice(start, min(start + step, tokens))
            loss, d, valid = _chunk(x[rows], weight, labels[rows], want_grad)
            losses[rows] = loss
            if d is None:
                continue
            torch.mul(d @ weight, valid.unsqueeze(1), out=grad_x[rows])
            row_weights = (token_weights[rows] * valid).unsqueeze(1)
            scaled = (x[rows] * row_weights.to(x.dtype)).to(weight.dtype)
            if grad_w is None:
                grad_w = d.t() @ scaled
            else:
                grad_w.addmm_(d.t(), scaled)
        if want_grad:
            ctx.save_for_backward(grad_x, grad_w, token_weights)
            ctx.weight_parameter = weight  # the Parameter: its main_grad
        return losses

    @staticmethod
    def backward(ctx, grad_losses):
        grad_x, grad_w, token_weights = ctx.saved_tensors
        grad_losses = grad_losses.to(torch.promote_types(grad_losses.dtype, torch.float32))
        input_grad = (grad_x * grad_losses.unsqueeze(1).to(grad_x.dtype)) \
            if ctx.needs_input_grad[0] else None
        weight_grad = None
        if ctx.needs_input_grad[1]:
            # g = c * w (the runtime's loss); c on the device: <g, w> / <w, w>
            norm = (token_weights * token_weights).sum().clamp_min(1e-30)
            scale = (grad_losses * token_weights).sum() / norm
            main_grad = getattr(ctx.weight_parameter, "main_grad", None)
            if main_grad is not None:  # one pass: main_grad += c GW, in main_grad's dtype
                main_grad.addcmul_(grad_w, scale.to(main_grad.dtype))
            else:
                weight_grad = grad_w * scale.to(grad_w.dtype)
        return input_grad, weight_grad, None, None


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                         token_weights: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token losses ``[b, s]`` of ``cross_entropy(hidden @ weight^T, labels)`` for
    ``hidden [s, b, h]`` (megatron's layout) and ``labels [b, s]``, chunked over tokens.

    ``token_weights`` ``[b, s]``: the weights the caller multiplies the losses by before
    summing (the loss mask; None: ones). The weight gradient assumes the gradient reaching
    these losses is proportional to them (module docstring)."""
    batch, seq = labels.shape
    x = hidden.transpose(0, 1).reshape(batch * seq, hidden.shape[-1])
    flat_labels = labels.reshape(-1)
    if token_weights is None:
        token_weights = torch.ones(batch * seq, device=x.device,
                                   dtype=torch.promote_types(x.dtype, torch.float32))
    else:
        # the loss mask lives on the host: a blocking copy would synchronise F's stream,
        # and a non_blocking one from pageable memory may (odc_pp.data.pinned)
        token_weights = token_weights.reshape(-1)
        wanted = torch.promote_types(x.dtype, torch.float32)
        if token_weights.device.type == "cpu" and token_weights.dtype != wanted:
            token_weights = token_weights.to(wanted)
        token_weights = to_device(token_weights, x.device).to(wanted)
    losses = _LinearCrossEntropy.apply(x, weight, flat_labels, token_weights)
    return losses.view(batch, seq)
