"""Linear layers whose weight-gradient GEMM can be deferred to the schedule's W action.

``DeferrableColumnParallelLinear`` / ``DeferrableRowParallelLinear`` subclass megatron's
tensor-parallel linears (TP=1) and override only ``_forward_impl``, the hook both use for
their matmul (:mod:`odc_pp.megatron.compat`). Their autograd function computes the input
gradient in backward; the weight gradient is either computed at once, or, while the
bound :class:`~odc_pp.runtime.wgrad.WeightGradQueue` is deferring, enqueued as a closure
(input, grad_output) for the schedule's W action. Biases stay in B.

A linear may apply an elementwise :class:`InputOp` to its input first (identity here;
layernorm and GeLU in :mod:`odc_pp.megatron.recompute`). The autograd function then saves
only the op's *input* and recomputes its output in backward, for the weight gradient and
for the op's own backward -- one function for the plain and the recomputing linears.

The queue is bound per module by the runtime (``wgrad_queue`` attribute), never
through a global. The layer spec that plugs these in is :mod:`odc_pp.megatron.spec`.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

__all__ = [
    "DeferrableColumnParallelLinear",
    "DeferrableRowParallelLinear",
    "InputOp",
    "accumulate_weight_grad",
    "weight_grad_or_defer",
]


def _weight_grad(saved_input: torch.Tensor, grad_output: torch.Tensor) -> torch.Tensor:
    """grad_output^T @ input, flattened over all leading dimensions."""
    return grad_output.reshape(-1, grad_output.shape[-1]).t().matmul(
        saved_input.reshape(-1, saved_input.shape[-1]))


def accumulate_weight_grad(weight: torch.Tensor, saved_input: torch.Tensor,
                           grad_output: torch.Tensor) -> None:
    """weight.grad += grad_output^T @ input (flattened over all leading dimensions)."""
    grad_weight = _weight_grad(saved_input, grad_output)
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
    return _weight_grad(saved_input, grad_output)


class InputOp:
    """What a deferrable linear applies to its input before the matmul: the identity.

    Subclasses (:mod:`odc_pp.megatron.recompute`) override all three methods; ``params``
    are the op's own parameters (autograd inputs, saved next to the op's input)."""

    def forward(self, x: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
        """The op's output."""
        return x

    def recompute(self, x: torch.Tensor, *params: torch.Tensor) -> tuple[torch.Tensor, object]:
        """(the op's output, what :meth:`backward` needs besides ``x`` and ``params``)."""
        return x, None

    def backward(self, grad_output: torch.Tensor, x: torch.Tensor, recomputed: object,
                 *params: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        """Gradients of ``(x, *params)`` from the gradient of the op's output."""
        return (grad_output,)


IDENTITY = InputOp()


class _DeferrableLinearFunction(torch.autograd.Function):
    """``linear(input_op(x), weight, bias)``; backward recomputes ``input_op(x)``,
    computes or defers the weight gradient, and runs the op's backward. Called as
    ``apply(x, weight, bias, layer)`` (identity) or
    ``apply(x, weight, bias, layer, input_op, *op_params)``."""

    @staticmethod
    def forward(ctx, x, weight, bias, layer, input_op=None, *op_params):
        ctx.save_for_backward(x, *op_params, weight)
        # the Parameter itself: saved-tensor hooks may hand back an alias, and the
        # deferred wgrad must land in this object's .grad
        ctx.weight_parameter = weight
        ctx.layer = layer
        ctx.input_op = IDENTITY if input_op is None else input_op
        ctx.op_given = input_op is not None
        ctx.has_bias = bias is not None
        return F.linear(ctx.input_op.forward(x, *op_params), weight, bias)

    @staticmethod
    def backward(ctx, grad_output):
        x, *op_params, weight = ctx.saved_tensors
        op_output, recomputed = ctx.input_op.recompute(x, *op_params)
        grad_op_output = grad_output.matmul(weight)
        grad_bias = None
        if ctx.has_bias:
            grad_bias = grad_output.reshape(-1, grad_output.shape[-1]).sum(0)
        grad_weight = weight_grad_or_defer(ctx.layer, ctx.weight_parameter, op_output,
                                           grad_output)
        grad_x, *grad_params = ctx.input_op.backward(grad_op_output, x, recomputed,
                                                     *op_params)
        extra = (None, *grad_params) if ctx.op_given else ()
        return (grad_x, grad_weight, grad_bias, None, *extra)


class _DeferrableMixin:
    """Checks, the input op and the matmul shared by the deferrable linears."""

    input_op: InputOp = IDENTITY

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
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

    def input_op_params(self) -> tuple[torch.Tensor, ...]:
        """The parameters of :attr:`input_op` (none for the identity)."""
        return ()

    def _forward_impl(self, input, weight, bias=None, *args, **kwargs):  # noqa: A002
        params = self.input_op_params()
        if not weight.requires_grad or self.native_autograd:
            return F.linear(self.input_op.forward(input, *params), weight, bias)
        return _DeferrableLinearFunction.apply(input, weight, bias, self, self.input_op,
                                               *params)


class DeferrableColumnParallelLinear(_DeferrableMixin, ColumnParallelLinear):
    """``ColumnParallelLinear`` (TP=1) whose weight gradient can be deferred to W."""


class DeferrableRowParallelLinear(_DeferrableMixin, RowParallelLinear):
    """``RowParallelLinear`` (TP=1) whose weight gradient can be deferred to W."""
