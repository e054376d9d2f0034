"""Linear layers whose weight-gradient GEMM can be deferred to the schedule's W action.

``DeferrableColumnParallelLinear`` / ``DeferrableRowParallelLinear`` subclass megatron's
tensor-parallel linears and override only ``_forward_impl``, the hook both use for
their matmul (:mod:`odc_pp.megatron.compat`). Their autograd function computes the input
gradient in backward; the weight gradient is either computed at once, or, while the
bound :class:`~odc_pp.runtime.wgrad.WeightGradQueue` is deferring, enqueued as a closure
(input, grad_output) for the schedule's W action. Biases stay in B.

Tensor parallelism. megatron's ``forward`` does the row-parallel output reduction and
tells ``_forward_impl`` what the column-parallel matmul must communicate (the
``allreduce_dgrad`` / ``sequence_parallel`` / ``tp_group`` arguments), which the autograd
function does itself: all-reduce of the input gradient (tp > 1), or under sequence
parallelism all-gather of the input along the sequence in F and reduce-scatter of the
input gradient in B. W needs the gathered input again: by default the closure keeps this
rank's shard and gathers it in W (less memory, one more all-gather on the critical path
of W); with ``keep_sp_input_for_w`` on the layer, B gathers it and the closure keeps
the full input until W (tp times the bytes, no communication in W). All of it runs on
the layer's explicit ``tp_group``.

A linear may apply an elementwise :class:`InputOp` to its input first (identity here;
layernorm and GeLU in :mod:`odc_pp.megatron.recompute`). The autograd function then saves
only the op's *input* and recomputes its output in backward, for the weight gradient and
for the op's own backward -- one function for the plain and the recomputing linears.

The queue is bound per module by the runtime (``wgrad_queue`` attribute), never
through a global. The layer spec that plugs these in is :mod:`odc_pp.megatron.spec`.
"""

from __future__ import annotations

import functools
import warnings

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import is_fake
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

from .tp import all_gather_rows, all_reduce_sum, reduce_scatter_rows, reduce_scatter_sequence

__all__ = [
    "DeferrableColumnParallelLinear",
    "DeferrableRowParallelLinear",
    "InputOp",
    "accumulate_into_main_grad",
    "accumulate_weight_grad",
    "weight_grad_or_defer",
]


def _weight_grad(saved_input: torch.Tensor, grad_output: torch.Tensor) -> torch.Tensor:
    """grad_output^T @ input, flattened over all leading dimensions."""
    return grad_output.reshape(-1, grad_output.shape[-1]).t().matmul(
        saved_input.reshape(-1, saved_input.shape[-1]))


def accumulate_into_main_grad(main_grad: torch.Tensor, saved_input: torch.Tensor,
                              grad_output: torch.Tensor) -> None:
    """``main_grad += grad_output^T @ input`` (flattened over the leading dimensions).

    Same dtypes: the product, then ``add_`` (what autograd's ``.grad`` + the engine's hook
    did). A wider ``main_grad`` (fp32 beside bf16 activations): the GEMM accumulates into
    it directly, as Megatron's ``gradient_accumulation_fusion`` does -- on CUDA one cuBLAS
    call with an fp32 output and beta = 1 (``torch.addmm(..., out_dtype=)``), so the bf16
    product is neither rounded nor written, read, converted and added (61 + 26 ms of an
    H200 step at the Llama-3-8B layer shape); elsewhere the same sum from fp32 copies."""
    grad_2d = grad_output.reshape(-1, grad_output.shape[-1])
    input_2d = saved_input.reshape(-1, saved_input.shape[-1])
    if main_grad.dtype == grad_output.dtype:
        main_grad.add_(grad_2d.t().matmul(input_2d))
    elif main_grad.is_contiguous() and (is_fake(main_grad) or _accumulating_gemm(
            main_grad.device, grad_2d.dtype, main_grad.dtype)):  # fake: the dry run
        torch.addmm(main_grad, grad_2d.t(), input_2d, out_dtype=main_grad.dtype,
                    out=main_grad)
    elif main_grad.is_cuda:  # this torch has no accumulating mixed-dtype GEMM
        main_grad.add_(grad_2d.t().matmul(input_2d))
    else:
        main_grad.addmm_(grad_2d.t().to(main_grad.dtype), input_2d.to(main_grad.dtype))


_ACCUMULATING_GEMM: dict = {}


def _accumulating_gemm(device: torch.device, dtype: torch.dtype, out_dtype: torch.dtype) -> bool:
    """Whether ``torch.addmm(c, a, b, out_dtype=, out=c)`` adds ``a @ b`` (``dtype``) into
    ``c`` (``out_dtype``) on ``device``: checked once per (device, dtypes) on a small
    product against the fp32 sum (CUDA only; the op has no CPU kernel)."""
    key = (device, dtype, out_dtype)
    if key not in _ACCUMULATING_GEMM:
        ok = False
        if device.type == "cuda":
            generator = torch.Generator().manual_seed(0)
            a, b, c = (torch.randn(*shape, generator=generator).to(device)
                       for shape in ((24, 40), (40, 16), (24, 16)))
            a, b, c = a.to(dtype), b.to(dtype), c.to(out_dtype)
            expected = c + a.to(out_dtype) @ b.to(out_dtype)
            try:
                torch.addmm(c, a, b, out_dtype=out_dtype, out=c)
                ok = bool(torch.allclose(c, expected, rtol=1e-4, atol=1e-4))
            except (RuntimeError, TypeError):
                ok = False
            if not ok:
                warnings.warn(f"torch {torch.__version__} on {device} has no GEMM that adds "
                              f"a {dtype} product into {out_dtype} (addmm out_dtype): "
                              "weight gradients are computed, then added", stacklevel=2)
        _ACCUMULATING_GEMM[key] = ok
    return _ACCUMULATING_GEMM[key]


def accumulate_weight_grad(weight: torch.Tensor, saved_input: torch.Tensor,
                           grad_output: torch.Tensor) -> None:
    """weight.grad += grad_output^T @ input (flattened over all leading dimensions); into
    ``weight.main_grad`` (:func:`accumulate_into_main_grad`) where a data-parallel engine
    gave the weight one (``odc_pp.odc.engine``, grad_accumulation 'local')."""
    main_grad = getattr(weight, "main_grad", None)
    if main_grad is not None:
        accumulate_into_main_grad(main_grad, saved_input, grad_output)
        return
    grad_weight = _weight_grad(saved_input, grad_output)
    if weight.grad is None:
        weight.grad = grad_weight.to(weight.dtype)
    else:
        weight.grad.add_(grad_weight)


def _accumulate_gathered(weight: torch.Tensor, input_shard: torch.Tensor, group,
                         grad_output: torch.Tensor) -> None:
    """W under sequence parallelism, gathering the input again."""
    accumulate_weight_grad(weight, all_gather_rows(input_shard, group), grad_output)


def weight_grad_or_defer(layer, weight: torch.Tensor, saved_input: torch.Tensor,
                         grad_output: torch.Tensor, *,
                         gather_group=None) -> torch.Tensor | None:
    """The weight gradient now, or None after enqueueing it into ``layer.wgrad_queue``
    when that queue is deferring (the closure keeps ``saved_input`` until W), or None
    after adding it into ``weight.main_grad`` now (:func:`accumulate_into_main_grad`:
    autograd's ``.grad`` and the engine's hook moving it are skipped).

    ``gather_group``: ``saved_input`` is this rank's sequence shard of the input, to be
    all-gathered over that group first -- now, in B (not deferring, or the layer's
    ``keep_sp_input_for_w``), or inside the closure, in W."""
    queue = layer.wgrad_queue
    deferring = queue is not None and queue.is_deferring
    if gather_group is not None and (not deferring or layer.keep_sp_input_for_w):
        saved_input, gather_group = all_gather_rows(saved_input, gather_group), None
    if deferring:
        if gather_group is not None:
            queue.put(functools.partial(_accumulate_gathered, weight, saved_input,
                                        gather_group, grad_output))
        else:
            queue.put(functools.partial(accumulate_weight_grad, weight, saved_input,
                                        grad_output))
        return None
    main_grad = getattr(weight, "main_grad", None)
    if main_grad is not None:
        accumulate_into_main_grad(main_grad, saved_input, grad_output)
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
    """``linear(gather?(input_op(x)), weight, bias)``; backward recomputes
    ``input_op(x)``, computes or defers the weight gradient, reduces the input gradient
    over the tensor-parallel group when asked, and runs the op's backward. Called as
    ``apply(x, weight, bias, layer, comm)`` (identity) or
    ``apply(x, weight, bias, layer, comm, input_op, *op_params)``; ``comm``: None,
    ``("allreduce", group)`` or ``("sequence", group)``."""

    @staticmethod
    def forward(ctx, x, weight, bias, layer, comm, input_op=None, *op_params):
        ctx.save_for_backward(x, *op_params, weight)
        # the Parameter itself: saved-tensor hooks may hand back an alias, and the
        # deferred wgrad must land in this object's .grad
        ctx.weight_parameter = weight
        ctx.layer = layer
        ctx.comm = comm
        ctx.input_op = IDENTITY if input_op is None else input_op
        ctx.op_given = input_op is not None
        ctx.has_bias = bias is not None
        op_output = ctx.input_op.forward(x, *op_params)
        if comm is not None and comm[0] == "sequence":
            op_output = all_gather_rows(op_output, comm[1])
        return F.linear(op_output, weight, bias)

    @staticmethod
    def backward(ctx, grad_output):
        x, *op_params, weight = ctx.saved_tensors
        op_output, recomputed = ctx.input_op.recompute(x, *op_params)
        grad_op_output = grad_output.matmul(weight)
        gather_group = None
        if ctx.comm is not None:
            kind, group = ctx.comm
            if kind == "sequence":
                grad_op_output = reduce_scatter_rows(grad_op_output, group)
                gather_group = group
            else:
                all_reduce_sum(grad_op_output, group)
        grad_bias = None
        if ctx.has_bias:
            grad_bias = grad_output.reshape(-1, grad_output.shape[-1]).sum(0)
        grad_weight = weight_grad_or_defer(ctx.layer, ctx.weight_parameter, op_output,
                                           grad_output, gather_group=gather_group)
        grad_x, *grad_params = ctx.input_op.backward(grad_op_output, x, recomputed,
                                                     *op_params)
        extra = (None, *grad_params) if ctx.op_given else ()
        return (grad_x, grad_weight, grad_bias, None, None, *extra)


class _DeferrableMixin:
    """Checks, the input op and the matmul shared by the deferrable linears."""

    input_op: InputOp = IDENTITY

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.config.gradient_accumulation_fusion:
            raise ValueError("set gradient_accumulation_fusion=False in the "
                             "TransformerConfig for deferrable linears")
        self.wgrad_queue = None
        # sequence parallelism: B keeps the all-gathered input for W (set by the model
        # builder from TensorParallel.keep_sp_input_for_w)
        self.keep_sp_input_for_w = False
        # True: plain F.linear autograd (no deferral), e.g. for torch.distributed.pipelining,
        # whose own input/weight split needs native autograd nodes
        self.native_autograd = False

    def input_op_params(self) -> tuple[torch.Tensor, ...]:
        """The parameters of :attr:`input_op` (none for the identity)."""
        return ()

    def _forward_impl(self, input, weight, bias=None, *args, allreduce_dgrad=False,  # noqa: A002
                      sequence_parallel=False, tp_group=None, **kwargs):
        params = self.input_op_params()
        comm = None
        if sequence_parallel:
            comm = ("sequence", tp_group)
        elif allreduce_dgrad:
            comm = ("allreduce", tp_group)
        if self.native_autograd:
            if comm is not None:
                raise ValueError("native autograd (torch.distributed.pipelining export) "
                                 "supports tensor-parallel size 1 only")
            return F.linear(self.input_op.forward(input, *params), weight, bias)
        if not weight.requires_grad and comm is None:
            return F.linear(self.input_op.forward(input, *params), weight, bias)
        return _DeferrableLinearFunction.apply(input, weight, bias, self, comm,
                                               self.input_op, *params)


class DeferrableColumnParallelLinear(_DeferrableMixin, ColumnParallelLinear):
    """``ColumnParallelLinear`` whose weight gradient can be deferred to W."""


class DeferrableRowParallelLinear(_DeferrableMixin, RowParallelLinear):
    """``RowParallelLinear`` whose weight gradient can be deferred to W. Under sequence
    parallelism the output reduce-scatter is :func:`~odc_pp.megatron.tp.
    reduce_scatter_sequence` (megatron's allocates on CUDA); otherwise megatron's
    ``forward`` runs unchanged."""

    def forward(self, input_):
        if not self.sequence_parallel:
            return super().forward(input_)
        output = reduce_scatter_sequence(self._forward_impl(input_, self.weight),
                                         self.tp_group)
        if self.skip_bias_add:
            return output, self.bias
        return (output + self.bias if self.bias is not None else output), None
