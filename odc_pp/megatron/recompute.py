"""Recompute layernorm, GeLU and hidden dropout in backward instead of saving their outputs.

A tensor that feeds a matmul must be available to that matmul's backward (its weight
gradient needs it), so the op producing it is fused into its consumer, the way
Transformer Engine's ``LayerNormLinear`` is plugged into megatron-core, entirely through
``ModuleSpec`` submodules (:func:`apply_recompute_lgd`):

* ``input_layernorm`` / ``pre_mlp_layernorm`` become ``IdentityOp`` and
  ``linear_qkv`` / ``linear_fc1`` become :class:`DeferrableNormColumnParallelLinear`: a
  layernorm + linear whose autograd function saves only the layernorm *input* (which the
  residual stream keeps anyway) and re-runs the layernorm in backward
  (``native_layer_norm`` + ``native_layer_norm_backward``: the same kernels autograd would
  run, so gradients are bitwise those of the stored path).
* ``mlp.activation_func`` becomes ``IdentityOp`` (megatron builds it when the
  TransformerConfig has ``use_te_activation_func=True``, the MLP's documented hook for a
  spec-provided activation) and ``linear_fc2`` becomes
  :class:`DeferrableGeluRowParallelLinear`, which applies GeLU to its input itself and
  saves only the pre-activation (which GeLU's own backward needs anyway).
* ``self_attn_bda`` / ``mlp_bda`` become :func:`get_recomputed_bias_dropout_add`:
  ``residual + dropout(x + bias)`` whose mask is not saved. **Choice: the RNG state is
  saved, not the mask.** Before drawing the mask the function records the generator state
  of the activation's device (5056 B for the CPU mt19937 generator, 16 B for CUDA's
  Philox) and in backward restores it, redraws the identical mask, and puts the caller's
  state back. That is O(1) per call instead of a bool (s*b*h B) or bit-packed (s*b*h/8 B)
  mask. The mask is drawn exactly like torch's CPU dropout
  (``empty.bernoulli_(1 - p).div_(1 - p)``), so on CPU the recompute path consumes the
  generator and produces values bitwise equal to megatron's unfused bias-dropout-add; on
  CUDA it is the same distribution but not the ``native_dropout`` stream.

Weight gradients go through the layer's :class:`~odc_pp.runtime.wgrad.WeightGradQueue`
like the plain deferrable linears: during B the recomputed layernorm/GeLU output is
handed to the deferred W closure (same size as the saved input it replaces, so keeping it
costs nothing over recomputing it again at W). Saved tensors are ordinary
``save_for_backward`` tensors, so the runtime's saved-tensor store accounts, offloads and
reloads them. The attention-probability dropout is not recomputed. Bytes saved: the
closed form is in :mod:`odc_pp.megatron.activation_memory`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core.fusions.fused_bias_dropout import _bias_dropout_add_func
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.spec_utils import ModuleSpec

from .layers import (DeferrableColumnParallelLinear, DeferrableRowParallelLinear,
                     weight_grad_or_defer)

__all__ = ["DeferrableNormColumnParallelLinear", "DeferrableGeluRowParallelLinear",
           "get_recomputed_bias_dropout_add", "apply_recompute_lgd", "CANONICAL_NORM_NAMES",
           "canonical_name"]

CANONICAL_NORM_NAMES = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "self_attention.linear_qkv.layer_norm_bias": "input_layernorm.bias",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
    "mlp.linear_fc1.layer_norm_bias": "pre_mlp_layernorm.bias",
}
"""Fused layernorm parameter -> the name it has in the stored (unfused) layer spec."""


def _bias_grad(grad_output: torch.Tensor) -> torch.Tensor:
    return grad_output.reshape(-1, grad_output.shape[-1]).sum(0)


# ----- layernorm + linear --------------------------------------------------------------
class _NormLinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, norm_weight, norm_bias, weight, bias, layer):
        normed = F.layer_norm(hidden, (hidden.shape[-1],), norm_weight, norm_bias,
                              layer.norm_eps)
        ctx.save_for_backward(hidden, norm_weight, norm_bias, weight)
        ctx.weight_parameter = weight  # the Parameter itself (see layers.py)
        ctx.layer = layer
        ctx.has_bias = bias is not None
        return F.linear(normed, weight, bias)

    @staticmethod
    def backward(ctx, grad_output):
        hidden, norm_weight, norm_bias, weight = ctx.saved_tensors
        shape = [hidden.shape[-1]]
        normed, mean, rstd = torch.native_layer_norm(hidden, shape, norm_weight, norm_bias,
                                                     ctx.layer.norm_eps)
        grad_normed = grad_output.matmul(weight)
        grad_bias = _bias_grad(grad_output) if ctx.has_bias else None
        grad_weight = weight_grad_or_defer(ctx.layer, ctx.weight_parameter, normed,
                                           grad_output)
        grad_hidden, grad_norm_weight, grad_norm_bias = \
            torch.ops.aten.native_layer_norm_backward(
                grad_normed, hidden, shape, mean, rstd, norm_weight, norm_bias,
                [True, True, True])
        return grad_hidden, grad_norm_weight, grad_norm_bias, grad_weight, grad_bias, None


class DeferrableNormColumnParallelLinear(DeferrableColumnParallelLinear):
    """LayerNorm + ``ColumnParallelLinear`` (TP=1) that recomputes the layernorm output in
    backward; its weight gradient can be deferred to W. Parameters ``layer_norm_weight``
    / ``layer_norm_bias`` (canonical names: :data:`CANONICAL_NORM_NAMES`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        config = self.config
        if config.normalization != "LayerNorm" or config.layernorm_zero_centered_gamma:
            raise ValueError("recompute_lgd supports normalization='LayerNorm' without "
                             "zero-centered gamma; turn recompute off for other norms")
        self.norm_eps = config.layernorm_epsilon
        self.layer_norm_weight = torch.nn.Parameter(
            torch.ones(self.input_size, dtype=config.params_dtype))
        self.layer_norm_bias = torch.nn.Parameter(
            torch.zeros(self.input_size, dtype=config.params_dtype))

    def _forward_impl(self, input, weight, bias=None, *args, **kwargs):  # noqa: A002
        if not weight.requires_grad or self.native_autograd:
            normed = F.layer_norm(input, (input.shape[-1],), self.layer_norm_weight,
                                  self.layer_norm_bias, self.norm_eps)
            return F.linear(normed, weight, bias)
        return _NormLinearFunction.apply(input, self.layer_norm_weight, self.layer_norm_bias,
                                         weight, bias, self)


# ----- GeLU + linear ---------------------------------------------------------------------
class _GeluLinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, pre_activation, weight, bias, layer):
        ctx.save_for_backward(pre_activation, weight)
        ctx.weight_parameter = weight
        ctx.layer = layer
        ctx.has_bias = bias is not None
        return F.linear(F.gelu(pre_activation), weight, bias)

    @staticmethod
    def backward(ctx, grad_output):
        pre_activation, weight = ctx.saved_tensors
        activation = F.gelu(pre_activation)
        grad_activation = grad_output.matmul(weight)
        grad_bias = _bias_grad(grad_output) if ctx.has_bias else None
        grad_weight = weight_grad_or_defer(ctx.layer, ctx.weight_parameter, activation,
                                           grad_output)
        grad_pre = torch.ops.aten.gelu_backward(grad_activation, pre_activation)
        return grad_pre, grad_weight, grad_bias, None


class DeferrableGeluRowParallelLinear(DeferrableRowParallelLinear):
    """GeLU + ``RowParallelLinear`` (TP=1): takes the MLP's pre-activation, recomputes the
    GeLU output in backward; its weight gradient can be deferred to W."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        config = self.config
        if config.activation_func is not F.gelu or config.gated_linear_unit:
            raise ValueError("recompute_lgd supports the plain GeLU MLP (activation_func="
                             "F.gelu, gated_linear_unit=False)")
        if not config.use_te_activation_func:
            raise ValueError("recompute_lgd applies GeLU inside linear_fc2: set "
                             "use_te_activation_func=True so the MLP uses the spec's "
                             "IdentityOp activation instead of applying GeLU twice")

    def _forward_impl(self, input, weight, bias=None, *args, **kwargs):  # noqa: A002
        if not weight.requires_grad or self.native_autograd:
            return F.linear(F.gelu(input), weight, bias)
        return _GeluLinearFunction.apply(input, weight, bias, self)


# ----- bias + dropout + residual -------------------------------------------------------
def _rng_state(device: torch.device) -> torch.Tensor:
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def _set_rng_state(state: torch.Tensor, device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


def _dropout_noise(shape, like: torch.Tensor, prob: float) -> torch.Tensor:
    """Scaled keep-mask, drawn like torch's composite (CPU) dropout."""
    noise = torch.empty(shape, dtype=like.dtype, device=like.device)
    return noise.bernoulli_(1 - prob).div_(1 - prob)


class _DropoutAddFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bias, residual, prob):
        rng_state = _rng_state(x.device)
        kept = x + bias if bias is not None else x
        noise = _dropout_noise(kept.shape, kept, prob)
        ctx.save_for_backward(rng_state)
        ctx.prob = prob
        ctx.bias_shape = bias.shape if bias is not None else None
        return residual + kept * noise

    @staticmethod
    def backward(ctx, grad_output):
        (rng_state,) = ctx.saved_tensors
        device = grad_output.device
        current = _rng_state(device)
        _set_rng_state(rng_state, device)
        try:
            noise = _dropout_noise(grad_output.shape, grad_output, ctx.prob)
        finally:
            _set_rng_state(current, device)
        grad_kept = grad_output * noise
        grad_bias = None if ctx.bias_shape is None else grad_kept.sum_to_size(ctx.bias_shape)
        return grad_kept, grad_bias, grad_output, None


def get_recomputed_bias_dropout_add(training: bool, fused: bool):
    """Drop-in for megatron's ``get_bias_dropout_add`` (spec ``self_attn_bda``/``mlp_bda``):
    ``residual + dropout(x + bias)`` recomputing the dropout mask in backward from the saved
    RNG state. ``fused`` is ignored (no jit fusion). Without dropout (eval, p = 0) or with
    p = 1 it is megatron's unfused function, which then saves nothing anyway."""

    def bias_dropout_add(x_with_bias, residual, prob):
        x, bias = x_with_bias
        if not training or not 0.0 < prob < 1.0:
            return _bias_dropout_add_func(x_with_bias, residual, prob, training)
        residual = residual if residual.dtype == x.dtype else residual.to(x.dtype)
        return _DropoutAddFunction.apply(x, bias, residual, prob)

    return bias_dropout_add


# ----- spec ----------------------------------------------------------------------------
def apply_recompute_lgd(spec: ModuleSpec) -> ModuleSpec:
    """Switch a deferrable local layer spec (in place) to recompute layernorm, GeLU and
    hidden dropout. Needs ``use_te_activation_func=True`` in the TransformerConfig."""
    layer = spec.submodules
    layer.input_layernorm = IdentityOp
    layer.pre_mlp_layernorm = IdentityOp
    layer.self_attention.submodules.linear_qkv = DeferrableNormColumnParallelLinear
    mlp = layer.mlp.submodules
    mlp.linear_fc1 = DeferrableNormColumnParallelLinear
    mlp.activation_func = IdentityOp
    mlp.linear_fc2 = DeferrableGeluRowParallelLinear
    layer.self_attn_bda = get_recomputed_bias_dropout_add
    layer.mlp_bda = get_recomputed_bias_dropout_add
    return spec


def canonical_name(name: str) -> str:
    """Map a fused layernorm parameter name to its stored-spec name (else unchanged)."""
    for fused, plain in CANONICAL_NORM_NAMES.items():
        if name.endswith(fused):
            return name[: -len(fused)] + plain
    return name

