"""The megatron-core layer spec of odc_pp's GPT chunks.

:func:`deferrable_gpt_layer_spec` is megatron's local spec (``get_gpt_layer_local_spec``)
with the four linears swapped for the deferrable linears of :mod:`odc_pp.megatron.layers`
and the core attention for :class:`~odc_pp.megatron.compat.HostDotProductAttention`;
:func:`apply_recompute_lgd` switches it to the recomputing layers of
:mod:`odc_pp.megatron.recompute`. Assembling the spec here keeps the layer modules free of
each other (recompute builds on layers; layers knows neither).
"""

from __future__ import annotations

import copy
import functools

from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.spec_utils import ModuleSpec

from .compat import HostDotProductAttention, SdpaDotProductAttention, TorchNorm, mlp_submodules
from .layers import DeferrableColumnParallelLinear, DeferrableRowParallelLinear
from .dropout import keyed_layer_spec
from .recompute import DeferrableGeluRowParallelLinear, DeferrableNormColumnParallelLinear
from .swiglu import SwiGLU

__all__ = ["deferrable_gpt_layer_spec", "apply_recompute_lgd", "CORE_ATTENTION"]


CORE_ATTENTION = {"host": HostDotProductAttention, "sdpa": SdpaDotProductAttention,
                  "megatron": None}
"""Core attention choices: ``host`` (CPU, explicit mask), ``sdpa`` (CUDA,
``scaled_dot_product_attention``), ``megatron`` (the spec's own ``DotProductAttention``)."""


def deferrable_gpt_layer_spec(*, host_attention: bool = True, recompute_lgd: bool = False,
                              core_attention: str | None = None,
                              normalization: str = "LayerNorm",
                              qk_layernorm: bool = False,
                              sequence_parallel: bool = False,
                              zero_centered_gamma: bool = False,
                              swiglu: bool = False, fused_swiglu: bool = False,
                              cp_group=None, cp_comm_type: str = "p2p") -> ModuleSpec:
    """megatron's ``get_gpt_layer_local_spec(normalization=, qk_layernorm=)`` with
    deferrable linears.

    ``core_attention``: a key of :data:`CORE_ATTENTION`; None: ``host`` when
    ``host_attention`` (needed on CPU) else megatron's ``DotProductAttention``.
    ``normalization``: ``LayerNorm`` or ``RMSNorm`` (layer, final and q/k norms);
    ``qk_layernorm``: normalise queries and keys per head (Qwen3). ``recompute_lgd``: the
    norms, the activation (GeLU or SwiGLU) and hidden dropout are recomputed in backward
    instead of saved (:func:`apply_recompute_lgd`; the TransformerConfig needs
    ``use_te_activation_func=True``). ``sequence_parallel``: the norms are
    :class:`~odc_pp.megatron.compat.TorchNorm`, which megatron's torch norm wrapper is
    except that it allows sequence parallelism. ``zero_centered_gamma`` (Megatron's
    ``--apply-layernorm-1p``; the TransformerConfig needs
    ``layernorm_zero_centered_gamma=True``): every norm is a ``TorchNorm`` too, which then
    stores its weight zero-centred and scales by ``1 + weight``. ``swiglu``: the MLP's
    activation is :class:`~odc_pp.megatron.swiglu.SwiGLU`, which saves only the fc1
    output, as Megatron's default fused bias-SwiGLU (the TransformerConfig needs
    ``use_te_activation_func=True``); ``fused_swiglu``: by its Triton kernels
    (:mod:`~odc_pp.megatron.swiglu_triton`). ``cp_group``: a
    context-parallel group of more than one rank: the core attention is
    :class:`~odc_pp.megatron.cp_attention.ContextParallelDotProductAttention` over it
    (``cp_comm_type`` ``p2p`` ring or ``a2a``), whatever ``core_attention`` says.
    Dropout is keyed by the data, the same in every layout
    (:func:`~odc_pp.megatron.dropout.keyed_layer_spec`).
    """
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    if core_attention is None:
        core_attention = "host" if host_attention else "megatron"
    if core_attention not in CORE_ATTENTION:
        raise ValueError(f"core_attention must be one of {sorted(CORE_ATTENTION)}, got "
                         f"{core_attention!r}")
    spec = copy.deepcopy(get_gpt_layer_local_spec(normalization=normalization,
                                                  qk_layernorm=qk_layernorm))
    attention = spec.submodules.self_attention.submodules
    if sequence_parallel or zero_centered_gamma or normalization == "RMSNorm":
        spec.submodules.input_layernorm = TorchNorm
        spec.submodules.pre_mlp_layernorm = TorchNorm
        if qk_layernorm:
            attention.q_layernorm = TorchNorm
            attention.k_layernorm = TorchNorm
    attention.linear_qkv = DeferrableColumnParallelLinear
    attention.linear_proj = DeferrableRowParallelLinear
    if cp_group is not None:
        from .cp_attention import ContextParallelDotProductAttention

        attention.core_attention = functools.partial(
            ContextParallelDotProductAttention, cp_group=cp_group, comm_type=cp_comm_type)
    elif CORE_ATTENTION[core_attention] is not None:
        attention.core_attention = CORE_ATTENTION[core_attention]
    mlp = mlp_submodules(spec)
    mlp.linear_fc1 = DeferrableColumnParallelLinear
    mlp.linear_fc2 = DeferrableRowParallelLinear
    if swiglu:
        mlp.activation_func = ModuleSpec(module=SwiGLU, params={"fused": fused_swiglu})
    keyed_layer_spec(spec)
    if recompute_lgd:
        apply_recompute_lgd(spec)
    return spec


def apply_recompute_lgd(spec: ModuleSpec) -> ModuleSpec:
    """Switch a deferrable local layer spec (in place) to recompute the pre-attention /
    pre-MLP norms (LayerNorm or RMSNorm), the MLP activation (GeLU or SwiGLU) and hidden
    dropout. Needs ``use_te_activation_func=True`` in the TransformerConfig."""
    layer = spec.submodules
    layer.input_layernorm = IdentityOp
    layer.pre_mlp_layernorm = IdentityOp
    layer.self_attention.submodules.linear_qkv = DeferrableNormColumnParallelLinear
    mlp = mlp_submodules(spec)
    mlp.linear_fc1 = DeferrableNormColumnParallelLinear
    mlp.activation_func = IdentityOp
    mlp.linear_fc2 = DeferrableGeluRowParallelLinear
    keyed_layer_spec(spec, recompute=True)
    return spec
