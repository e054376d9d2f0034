"""Recompute layernorm, GeLU and hidden dropout in backward instead of saving their outputs.

A tensor that feeds a matmul must be available to that matmul's backward (its weight
gradient needs it), so the op producing it is fused into its consumer, the way
Transformer Engine's ``LayerNormLinear`` is plugged into megatron-core, entirely through
``ModuleSpec`` submodules (:func:`odc_pp.megatron.spec.apply_recompute_lgd`):

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
* ``self_attn_bda`` / ``mlp_bda`` become the keyed bias-dropout-add of
  :mod:`odc_pp.megatron.dropout` with ``recompute=True``: ``residual + dropout(x + bias)``
  whose mask is not saved. Its mask is a hash of the data (sample, token, layer, site,
  hidden unit), so backward recomputes it from the ``[s, b, 1]`` token keys it saves
  (8 B per token instead of a bool s*b*h B mask), identical to the stored path's.

Both linears are the plain deferrable linears of :mod:`odc_pp.megatron.layers` with an
:class:`~odc_pp.megatron.layers.InputOp` (:class:`LayerNormInputOp`, :class:`GeluInputOp`):
one autograd function saves the op's input and recomputes its output in backward.
Weight gradients go through the layer's :class:`~odc_pp.runtime.wgrad.WeightGradQueue`
like the plain deferrable linears: during B the recomputed layernorm/GeLU output is
handed to the deferred W closure (same size as the saved input it replaces, so keeping it
costs nothing over recomputing it again at W). Saved tensors are ordinary
``save_for_backward`` tensors, so the runtime's saved-tensor store accounts, offloads and
reloads them. The attention-probability dropout is not recomputed. Bytes saved: the
closed form is in :mod:`odc_pp.planner.memory`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .layers import DeferrableColumnParallelLinear, DeferrableRowParallelLinear, InputOp

__all__ = ["DeferrableNormColumnParallelLinear", "DeferrableGeluRowParallelLinear",
           "LayerNormInputOp", "GeluInputOp", "RMSNormInputOp", "SwiGLUInputOp",
           "AutogradInputOp",
           "CANONICAL_NORM_NAMES", "canonical_name"]

CANONICAL_NORM_NAMES = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "self_attention.linear_qkv.layer_norm_bias": "input_layernorm.bias",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
    "mlp.linear_fc1.layer_norm_bias": "pre_mlp_layernorm.bias",
}
"""Fused layernorm parameter -> the name it has in the stored (unfused) layer spec."""


# ----- layernorm + linear --------------------------------------------------------------
class LayerNormInputOp(InputOp):
    """LayerNorm over the last dimension; params ``(weight, bias)``. Backward recomputes
    with ``native_layer_norm`` and runs ``native_layer_norm_backward``: the kernels
    autograd would run, so gradients are bitwise those of the stored path."""

    def __init__(self, eps: float, zero_centered_gamma: bool = False) -> None:
        self.eps = eps
        self.zero_centered_gamma = zero_centered_gamma
        """The weight is stored zero-centred: the norm scales by ``1 + weight`` (whose
        gradient is the weight's)."""

    def _gamma(self, weight):
        return weight + 1 if self.zero_centered_gamma else weight

    def forward(self, x, *params):
        weight, bias = params
        return F.layer_norm(x, (x.shape[-1],), self._gamma(weight), bias, self.eps)

    def recompute(self, x, *params):
        weight, bias = params
        normed, mean, rstd = torch.native_layer_norm(x, [x.shape[-1]], self._gamma(weight),
                                                     bias, self.eps)
        return normed, (mean, rstd)

    def backward(self, grad_output, x, recomputed, *params):
        weight, bias = params
        mean, rstd = recomputed
        return torch.ops.aten.native_layer_norm_backward(
            grad_output, x, [x.shape[-1]], mean, rstd, self._gamma(weight), bias,
            [True, True, True])


class AutogradInputOp(InputOp):
    """An op whose backward re-runs its forward under autograd and differentiates it.
    Gradients equal the stored path's to rounding, not bitwise: measured with RMSNorm
    the op's own input gradient is bitwise equal, yet gradients upstream of it differ in
    the last bits (about 1e-7 relative); LayerNorm and GeLU use the exact native kernels
    (:class:`LayerNormInputOp`, :class:`GeluInputOp`) and are bitwise."""

    def recompute(self, x, *params):
        with torch.enable_grad():
            inputs = [t.detach().requires_grad_(t.requires_grad or i == 0)
                      for i, t in enumerate((x, *params))]
            output = self.forward(*inputs)
        return output.detach(), (inputs, output)

    def backward(self, grad_output, x, recomputed, *params):
        inputs, output = recomputed
        wanted = [t for t in inputs if t.requires_grad]
        grads = iter(torch.autograd.grad(output, wanted, grad_output))
        return tuple(next(grads) if t.requires_grad else None for t in inputs)


class RMSNormInputOp(AutogradInputOp):
    """RMSNorm over the last dimension (``F.rms_norm``, what megatron's local spec runs
    through ``torch.nn.RMSNorm``); params ``(weight,)``."""

    def __init__(self, eps: float, zero_centered_gamma: bool = False) -> None:
        self.eps = eps
        self.zero_centered_gamma = zero_centered_gamma
        """The weight is stored zero-centred: the norm scales by ``1 + weight``."""

    def forward(self, x, *params):
        (weight,) = params
        gamma = weight + 1 if self.zero_centered_gamma else weight
        return F.rms_norm(x, (x.shape[-1],), gamma, self.eps)


class DeferrableNormColumnParallelLinear(DeferrableColumnParallelLinear):
    """LayerNorm or RMSNorm + ``ColumnParallelLinear`` (TP=1) that recomputes the norm
    output in backward; its weight gradient can be deferred to W. Parameters
    ``layer_norm_weight`` (/ ``layer_norm_bias`` for LayerNorm) (canonical names:
    :data:`CANONICAL_NORM_NAMES`). With ``layernorm_zero_centered_gamma`` the norm weight
    is stored zero-centred (initialised to 0, the norm scales by ``1 + weight``)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        config = self.config
        if config.normalization not in ("LayerNorm", "RMSNorm"):
            raise ValueError("recompute_lgd supports normalization='LayerNorm' or 'RMSNorm'; "
                             "turn recompute off for other norms")
        centered = bool(config.layernorm_zero_centered_gamma)
        self.layer_norm_weight = torch.nn.Parameter(
            (torch.zeros if centered else torch.ones)(self.input_size,
                                                      dtype=config.params_dtype))
        if config.normalization == "RMSNorm":
            self.input_op = RMSNormInputOp(config.layernorm_epsilon, centered)
            self.layer_norm_bias = None
        else:
            self.input_op = LayerNormInputOp(config.layernorm_epsilon, centered)
            self.layer_norm_bias = torch.nn.Parameter(
                torch.zeros(self.input_size, dtype=config.params_dtype))

    def input_op_params(self) -> tuple[torch.Tensor, ...]:
        if self.layer_norm_bias is None:
            return (self.layer_norm_weight,)
        return self.layer_norm_weight, self.layer_norm_bias


# ----- GeLU + linear ---------------------------------------------------------------------
class GeluInputOp(InputOp):
    """GeLU; backward recomputes it and runs ``gelu_backward`` on the pre-activation
    (which GeLU's own backward needs anyway)."""

    def forward(self, x, *params):
        return F.gelu(x)

    def recompute(self, x, *params):
        return F.gelu(x), None

    def backward(self, grad_output, x, recomputed, *params):
        return (torch.ops.aten.gelu_backward(grad_output, x),)


class SwiGLUInputOp(AutogradInputOp):
    """SwiGLU on megatron's fused ``linear_fc1`` output ``[gate | up]``:
    ``silu(gate) * up`` (megatron's unfused ``glu``)."""

    def forward(self, x, *params):
        gate, up = torch.chunk(x, 2, dim=-1)
        return F.silu(gate) * up


class DeferrableGeluRowParallelLinear(DeferrableRowParallelLinear):
    """Activation + ``RowParallelLinear`` (TP=1): takes the MLP's pre-activation, applies
    GeLU (or SwiGLU with ``gated_linear_unit`` and ``activation_func=F.silu``) itself and
    recomputes its output in backward; its weight gradient can be deferred to W."""

    input_op = GeluInputOp()

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        config = self.config
        if config.gated_linear_unit and config.activation_func is F.silu and \
                config.activation_func_clamp_value is None and not config.glu_linear_offset:
            self.input_op = SwiGLUInputOp()
        elif config.activation_func is not F.gelu or config.gated_linear_unit:
            raise ValueError("recompute_lgd supports the GeLU MLP (activation_func=F.gelu) "
                             "and SwiGLU (gated_linear_unit, activation_func=F.silu)")
        if not config.use_te_activation_func:
            raise ValueError("recompute_lgd applies GeLU inside linear_fc2: set "
                             "use_te_activation_func=True so the MLP uses the spec's "
                             "IdentityOp activation instead of applying GeLU twice")


def canonical_name(name: str) -> str:
    """Map a fused layernorm parameter name to its stored-spec name (else unchanged)."""
    for fused, plain in CANONICAL_NORM_NAMES.items():
        if name.endswith(fused):
            return name[: -len(fused)] + plain
    return name

