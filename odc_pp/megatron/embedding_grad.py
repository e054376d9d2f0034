"""The word-embedding lookup whose backward adds the looked-up rows' gradients straight
into the weight's fp32 ``main_grad`` (issue 50).

Autograd's embedding backward makes a dense ``vocabulary x hidden`` gradient in the
weight's dtype (bf16: 1 GiB at Llama-3's 128256 x 4096), which the data-parallel engine's
hook then adds into the fp32 ``main_grad`` (``odc_pp.odc.engine``): a full-size write,
read and mixed-dtype add per microbatch for a gradient that has one row per token. Where
the weight has a ``main_grad`` (the engine's ``grad_accumulation`` 'local'),
:func:`lookup_rows` instead adds each token's output-gradient row, converted to
``main_grad``'s dtype, into that row of ``main_grad`` (``index_add_``;
``index_put_(accumulate=True)`` under megatron's ``deterministic_mode``, whose CUDA
kernel sums in a fixed order) and returns no weight gradient: ``.grad`` stays None and
the temporaries are ``tokens x hidden``. As the decoder's linears do
(:func:`~odc_pp.megatron.layers.accumulate_into_main_grad`), the sum is the fp32 sum of
the rows, not of a bf16-rounded dense gradient. Without ``main_grad`` the lookup is
megatron's (autograd's embedding backward, ``.grad``).

:class:`MainGradVocabParallelEmbedding` is megatron's ``VocabParallelEmbedding`` with
that lookup (:func:`use_main_grad_lookup` swaps a built module's class; it adds no
state). A weight shared with the output layer in one chunk gets both contributions in its
one ``main_grad``; a tied copy on another stage has its own, summed by
:class:`~odc_pp.odc.tied.TiedGradients`.
"""

from __future__ import annotations

import torch
from megatron.core.tensor_parallel.layers import VocabParallelEmbedding
from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

__all__ = ["lookup_rows", "vocab_rows", "MainGradVocabParallelEmbedding",
           "use_main_grad_lookup"]


class _LookupIntoMainGrad(torch.autograd.Function):
    """``weight[ids]`` whose backward adds into ``weight.main_grad``."""

    @staticmethod
    def forward(ctx, ids, weight, deterministic):  # noqa: D401
        ctx.save_for_backward(ids)
        ctx.weight_parameter = weight  # the Parameter: its main_grad, not an alias's
        ctx.deterministic = deterministic
        return torch.nn.functional.embedding(ids, weight)

    @staticmethod
    def backward(ctx, grad_output):
        (ids,) = ctx.saved_tensors
        main_grad = ctx.weight_parameter.main_grad
        rows = grad_output.reshape(-1, grad_output.shape[-1]).to(main_grad.dtype)
        index = ids.reshape(-1)
        if ctx.deterministic:
            main_grad.index_put_((index,), rows, accumulate=True)
        else:
            main_grad.index_add_(0, index, rows)
        return None, None, None


def lookup_rows(ids: torch.Tensor, weight: torch.Tensor, *,
                deterministic: bool = False) -> torch.Tensor:
    """``weight[ids]`` (``[*ids.shape, hidden]``); its gradient goes into
    ``weight.main_grad`` where the weight has one (module docstring), else into ``.grad``
    as autograd's embedding does (``deterministic``: megatron's index form)."""
    if getattr(weight, "main_grad", None) is not None and weight.requires_grad \
            and torch.is_grad_enabled():
        return _LookupIntoMainGrad.apply(ids, weight, deterministic)
    if deterministic:
        return weight[ids]
    return torch.nn.functional.embedding(ids, weight)


def vocab_rows(words: VocabParallelEmbedding, tokens: torch.Tensor) -> torch.Tensor:
    """This tensor-parallel rank's rows for ``tokens`` (zeros for tokens outside its
    vocabulary range), before the reduction over the group."""
    if words.tp_group.size() == 1:
        return lookup_rows(tokens, words.weight, deterministic=words.deterministic_mode)
    outside = (tokens < words.vocab_start_index) | (tokens >= words.vocab_end_index)
    local = (tokens - words.vocab_start_index).masked_fill(outside, 0)
    rows = lookup_rows(local, words.weight, deterministic=words.deterministic_mode)
    return rows.masked_fill(outside.unsqueeze(-1), 0.0)


class MainGradVocabParallelEmbedding(VocabParallelEmbedding):
    """megatron's ``VocabParallelEmbedding`` looking up with :func:`vocab_rows`."""

    def forward(self, input_):
        rows = vocab_rows(self, input_)
        if self.reduce_scatter_embeddings:
            from .tp import reduce_scatter_sequence

            return reduce_scatter_sequence(rows.transpose(0, 1).contiguous(), self.tp_group)
        return reduce_from_tensor_model_parallel_region(rows, group=self.tp_group)


def use_main_grad_lookup(words: torch.nn.Module) -> None:
    """Make a built ``VocabParallelEmbedding`` a :class:`MainGradVocabParallelEmbedding`
    (same parameters and attributes; only ``forward`` differs)."""
    if not isinstance(words, VocabParallelEmbedding):
        raise TypeError(f"expected megatron's VocabParallelEmbedding, got "
                        f"{type(words).__name__}")
    words.__class__ = MainGradVocabParallelEmbedding
