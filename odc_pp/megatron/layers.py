"""megatron-core layer spec whose linear layers can defer their weight-gradient GEMM.

``DeferrableColumnParallelLinear`` / ``DeferrableRowParallelLinear`` subclass megatron's
tensor-parallel linears (TP=1) and override only ``_forward_impl``, the documented hook
both use for their matmul. Their autograd function computes the input gradient in
backward; the weight gradient is either computed at once, or, while the bound
:class:`~odc_pp.runtime.wgrad.WeightGradQueue` is deferring, enqueued as a closure
(saved input, grad_output) for the schedule's W action. Biases stay in B.

The queue is bound per module by the runtime (``wgrad_queue`` attribute), never
through a global. :func:`deferrable_gpt_layer_spec` is megatron's local spec with the
four linears and the core attention swapped (see :mod:`odc_pp.megatron.cpu_compat`);
with ``recompute_lgd`` it also recomputes layernorm/GeLU/dropout (:mod:`.recompute`).
"""

from __future__ import annotations

import copy
import functools

import torch
import torch.nn.functional as F
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.spec_utils import ModuleSpec

__all__ = [
    "DeferrableColumnParallelLinear",
    "DeferrableRowParallelLinear",
    "HostDotProductAttention",
    "deferrable_gpt_layer_spec",
    "accumulate_weight_grad",
    "weight_grad_or_defer",
]


def accumulate_weight_grad(weight: torch.Tensor, saved_input: torch.Tensor,
                           grad_output: torch.Tensor) -> None:
    """weight.grad += grad_output^T @ input (flattened over all leading dimensions)."""
    grad_weight = grad_output.reshape(-1, grad_output.shape[-1]).t().matmul(
        saved_input.reshape(-1, saved_input.shape[-1]))
    if weight.grad is None:
        weight.grad = grad_weight.to(weight.dtype)
    else:
        weight.grad.add_(grad_weight)


def weight_grad_or_defer(layer, weight: torch.Tensor, saved_input: torch.Tensor,
                         grad_output: torch.Tensor) -> torch.Tensor | None:
    """The weight gradient now, or None after enqueueing it into ``layer.wgrad_queue``
    when that queue is deferring (the closure keeps ``saved_input`` until W)."""
    queue = layer.wgrad_queue
    if queue is not None and queue.is_deferring:
        queue.put(functools.partial(accumulate_weight_grad, weight, saved_input, grad_output))
        return None
    return grad_output.reshape(-1, grad_output.shape[-1]).t().matmul(
        saved_input.reshape(-1, saved_input.shape[-1]))


class _DeferrableLinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, saved_input, weight, bias, layer):
        ctx.save_for_backward(saved_input, weight)
        # the Parameter itself: saved-tensor hooks may hand back an alias, and the
        # deferred wgrad must land in this object's .grad
        ctx.weight_parameter = weight
        ctx.layer = layer
        ctx.has_bias = bias is not None
        return F.linear(saved_input, weight, bias)

    @staticmethod
    def backward(ctx, grad_output):
        saved_input, weight = ctx.saved_tensors
        grad_input = grad_output.matmul(weight)
        grad_bias = None
        if ctx.has_bias:
            grad_bias = grad_output.reshape(-1, grad_output.shape[-1]).sum(0)
        grad_weight = weight_grad_or_defer(ctx.layer, ctx.weight_parameter, saved_input,
                                           grad_output)
        return grad_input, grad_weight, grad_bias, None


class _DeferrableMixin:
    """Shared checks and matmul for the two linear subclasses."""


    def _check_deferrable(self) -> None:
        if self.tp_group is not None and self.tp_group.size() != 1:
            raise ValueError("deferrable linears support tensor-parallel size 1 only; "
                             "use the TE spec for TP > 1")
        if self.config.sequence_parallel or self.config.gradient_accumulation_fusion:
            raise ValueError("set sequence_parallel=False and gradient_accumulation_fusion="
                             "False in the TransformerConfig for deferrable linears")
        self.wgrad_queue = None
        # True: plain F.linear autograd (no deferral), e.g. for torch.distributed.pipelining,
        # whose own input/weight split needs native autograd nodes
        self.native_autograd = False

    def _forward_impl(self, input, weight, bias=None, *args, **kwargs):  # noqa: A002
        if not weight.requires_grad or self.native_autograd:
            return F.linear(input, weight, bias)
        return _DeferrableLinearFunction.apply(input, weight, bias, self)


class DeferrableColumnParallelLinear(_DeferrableMixin, ColumnParallelLinear):
    """``ColumnParallelLinear`` (TP=1) whose weight gradient can be deferred to W."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._check_deferrable()


class DeferrableRowParallelLinear(_DeferrableMixin, RowParallelLinear):
    """``RowParallelLinear`` (TP=1) whose weight gradient can be deferred to W."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._check_deferrable()


class HostDotProductAttention(DotProductAttention):
    """Megatron's unfused attention with its score buffer allocated on the input's device
    (the parent takes it from a CUDA-only global buffer) and dropout on the default
    generator. Same math: scaled QK^T, megatron's mask+softmax module, dropout, PV."""

    def forward(self, query, key, value, attention_mask, attn_mask_type=None,
                attention_bias=None, packed_seq_params=None):
        if packed_seq_params is not None or attention_bias is not None:
            raise ValueError("HostDotProductAttention supports neither packed sequences "
                             "nor attention bias")
        if attention_mask is None:
            raise ValueError("pass an explicit attention mask (cpu_compat.causal_mask)")
        groups = self.num_attention_heads_per_partition // self.num_query_groups_per_partition
        if groups > 1:
            key = key.repeat_interleave(groups, dim=2)
            value = value.repeat_interleave(groups, dim=2)
        seq_q, batch, heads, head_dim = query.shape
        # [s, b, n, d] -> [b*n, s, d]
        query = query.reshape(seq_q, batch * heads, head_dim).transpose(0, 1)
        key = key.reshape(key.shape[0], batch * heads, head_dim).transpose(0, 1)
        value = value.reshape(value.shape[0], batch * heads, head_dim).transpose(0, 1)
        scores = torch.bmm(query, key.transpose(1, 2)) * self.softmax_scale
        scores = scores.view(batch, heads, seq_q, key.shape[1])
        probs = self.scale_mask_softmax(scores, attention_mask, self.softmax_offset)
        probs = self.attention_dropout(probs)
        context = torch.bmm(probs.view(batch * heads, seq_q, -1), value)
        # [b*n, s, d] -> [s, b, n*d]
        context = context.view(batch, heads, seq_q, head_dim).permute(2, 0, 1, 3)
        return context.reshape(seq_q, batch, self.hidden_size_per_partition)


def deferrable_gpt_layer_spec(*, host_attention: bool = True,
                              recompute_lgd: bool = False) -> ModuleSpec:
    """megatron's ``get_gpt_layer_local_spec()`` with deferrable linears.

    ``host_attention``: use :class:`HostDotProductAttention` (needed on CPU, harmless on
    GPU) instead of ``DotProductAttention``. ``recompute_lgd``: layernorm, GeLU and hidden
    dropout are recomputed in backward instead of saved (:mod:`odc_pp.megatron.recompute`;
    the TransformerConfig needs ``use_te_activation_func=True``).
    """
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = copy.deepcopy(get_gpt_layer_local_spec())
    attention = spec.submodules.self_attention.submodules
    attention.linear_qkv = DeferrableColumnParallelLinear
    attention.linear_proj = DeferrableRowParallelLinear
    if host_attention:
        attention.core_attention = HostDotProductAttention
    mlp = spec.submodules.mlp.submodules
    mlp.linear_fc1 = DeferrableColumnParallelLinear
    mlp.linear_fc2 = DeferrableRowParallelLinear
    if recompute_lgd:
        from .recompute import apply_recompute_lgd

        apply_recompute_lgd(spec)
    return spec
