"""Closed forms of the saved-activation bytes that ``recompute_lgd`` removes (torch-free).

Per transformer layer and microbatch, with ``tokens = s * b``, hidden size h, MLP width f,
``e`` bytes per activation value and ``m`` bytes per dropout-mask element, the layer
stops saving (see :mod:`odc_pp.megatron.recompute`):

* the two layernorm outputs (inputs of ``linear_qkv`` and ``linear_fc1``):
  ``2 * tokens * h * e``, plus the two per-token statistics (mean, rstd) of each
  layernorm, ``2 * 2 * tokens * stat_bytes`` (fp32 statistics: ``stat_bytes = 4``);
* the GeLU output (input of ``linear_fc2``): ``tokens * f * e``;
* with hidden dropout > 0, the two hidden-dropout masks ``2 * tokens * h * m``, replaced by
  two RNG states of ``rng_state_bytes`` each (held in the saved-tensor store when the
  generator state lives on the compute device's host, i.e. the CPU generator on CPU).

With f = 4h, e = 2 (bf16), m = 1 (CUDA's bool mask) and the O(tokens) terms dropped,
this is 14 * s * b * h: the standard per-layer 34 sbh (+ 5 a s^2 b) becomes 20 sbh
(Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models").
``odc_pp.planner.offload_tuner`` uses :func:`lgd_saving_per_token_hidden` for that
coefficient. The attention-probability dropout is not recomputed (it stays in the
5 a s^2 b term).
"""

from __future__ import annotations

__all__ = ["lgd_saving_per_token_hidden", "lgd_saved_bytes_per_layer", "dropout_mask_bytes",
           "CPU_RNG_STATE_BYTES"]

CPU_RNG_STATE_BYTES = 5056
"""Size of ``torch.get_rng_state()`` (the mt19937 CPU generator state)."""


def dropout_mask_bytes(device_type: str, bytes_per_value: int) -> int:
    """Bytes per element that a *stored* dropout keeps for backward: CUDA's
    ``native_dropout`` saves a bool mask; on CPU torch's composite dropout saves its
    scaled noise tensor in the activation dtype."""
    return 1 if device_type == "cuda" else bytes_per_value


def lgd_saving_per_token_hidden(*, ffn_ratio: float = 4.0, bytes_per_value: int = 2,
                                mask_bytes: int = 1, dropout: bool = True) -> float:
    """Bytes per (token x hidden unit) that recomputing layernorm, GeLU and dropout removes
    from one layer, ignoring the O(tokens) terms: ``(2 + ffn_ratio) * e + 2 * m``."""
    return (2 + ffn_ratio) * bytes_per_value + (2 * mask_bytes if dropout else 0)


def lgd_saved_bytes_per_layer(*, tokens: int, hidden_size: int, ffn_hidden_size: int,
                              bytes_per_value: int, dropout: bool, mask_bytes: int,
                              stat_bytes: int = 4, rng_state_bytes: int = 0) -> int:
    """Exact bytes one layer stops holding per microbatch (module docstring)."""
    norms = 2 * tokens * (hidden_size * bytes_per_value + 2 * stat_bytes)
    gelu = tokens * ffn_hidden_size * bytes_per_value
    masks = 2 * (tokens * hidden_size * mask_bytes - rng_state_bytes) if dropout else 0
    return norms + gelu + masks
