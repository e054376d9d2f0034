"""The shape of the GPT :func:`odc_pp.megatron.model.build_chunks` builds
(:class:`ModelConfig`): its size, architecture (GPT or the Llama family), dtype,
recompute and kernel choices, checked on construction."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..dtypes import float_dtype
from .linear_cross_entropy import FUSED_CROSS_ENTROPY
from .packed_attention import PACKED_KERNELS

__all__ = ["ModelConfig"]

NORMALIZATIONS = ("LayerNorm", "RMSNorm")
ACTIVATIONS = ("gelu", "swiglu")
POSITION_EMBEDDINGS = ("learned_absolute", "rope")
ATTENTION_BACKENDS = ("auto", "host", "sdpa")


@dataclass(kw_only=True)
class ModelConfig:
    """Shape of the GPT to build."""

    vocab_size: int = 128
    """Vocabulary size (output layer rows)."""
    hidden_size: int = 64
    """Model width."""
    num_layers: int = 4
    """Decoder layers in the whole model (split over pp * num_chunks stages)."""
    num_layers_in_first_pipeline_stage: int | None = None
    """Layers of the first pipeline stage (megatron-core's field of that name; None: even
    stages, :class:`~odc_pp.schedule.stage_layout.StageLayout`)."""
    num_layers_in_last_pipeline_stage: int | None = None
    """Layers of the last pipeline stage (megatron-core's field of that name)."""
    account_for_embedding_in_pipeline_split: bool = False
    """The embedding counts as a layer of the split: the first virtual stage holds one
    decoder layer fewer (megatron-core's field of that name)."""
    account_for_loss_in_pipeline_split: bool = False
    """The loss counts as a layer of the split: the last virtual stage holds one decoder
    layer fewer (megatron-core's field of that name)."""
    num_attention_heads: int = 4
    """Attention heads; must divide hidden_size."""
    ffn_hidden_size: int | None = None
    """MLP width; None: 4 * hidden_size."""
    max_sequence_length: int = 64
    """Longest sequence (learned position embeddings)."""
    params_dtype: str = "float32"
    """Parameter dtype: float32, bfloat16 or float16."""
    init_method_std: float = 0.02
    """Std of the normal init of weights (output projections are scaled by 1/sqrt(2L))."""
    hidden_dropout: float = 0.0
    """Dropout on the embedding and after attention/MLP (keyed by the data:
    :mod:`odc_pp.megatron.dropout`)."""
    attention_dropout: float = 0.0
    """Dropout on attention probabilities (keyed by the data)."""
    device: str = "cpu"
    """Device the chunks live on."""
    recompute_lgd: bool = False
    """Recompute norm, activation (GeLU / SwiGLU) and hidden-dropout outputs in backward
    instead of saving them (:mod:`odc_pp.megatron.recompute`). Same losses and gradients
    (bitwise on CPU), fewer saved bytes (:mod:`odc_pp.planner.memory`).
    Parameter names from ``global_named_parameters`` do not change."""
    recompute_method: str | None = None
    """Full activation recompute (:mod:`odc_pp.megatron.full_recompute`): uniform or
    block, as Megatron's --recompute-method; None: off."""
    recompute_num_layers: int = 1
    """With ``recompute_method``: group size (uniform) or recomputed layers per chunk
    (block)."""
    normalization: str = "LayerNorm"
    """LayerNorm or RMSNorm (layer norms, final norm, q/k norms)."""
    norm_epsilon: float = 1e-5
    """Epsilon of the norms."""
    apply_layernorm_1p: bool = False
    """Zero-centred norm weights (Megatron's ``--apply-layernorm-1p``): every norm (layer,
    final, q/k) stores its weight initialised to 0 and scales by ``1 + weight``."""
    activation: str = "gelu"
    """MLP: gelu (fc1 -> GeLU -> fc2) or swiglu (fc1 = [gate | up], silu(gate) * up)."""
    num_query_groups: int | None = None
    """Key/value heads (grouped-query attention); None: num_attention_heads."""
    kv_channels: int | None = None
    """Head dimension; None: hidden_size / num_attention_heads."""
    position_embedding_type: str = "learned_absolute"
    """learned_absolute or rope."""
    rotary_base: float = 10000.0
    """RoPE base (Hugging Face ``rope_theta``)."""
    rope_scaling: dict | None = None
    """Llama-3 RoPE scaling: ``factor``, ``low_freq_factor``, ``high_freq_factor``,
    ``original_max_position_embeddings``; None: none."""
    add_bias_linear: bool = True
    """Biases in every linear (GPT); False: none (Llama)."""
    add_qkv_bias: bool = False
    """A bias in the qkv projection even without add_bias_linear (Qwen2)."""
    qk_layernorm: bool = False
    """Normalise queries and keys per head before RoPE (Qwen3)."""
    tie_embeddings: bool = False
    """Output layer tied to the embedding: one shared weight when a chunk holds both,
    else a copy on the last stage whose gradient is summed with the embedding's before
    each step (:func:`tied_embedding_params`)."""
    attention_backend: str = "auto"
    """Core attention: host (megatron's math, explicit mask), sdpa
    (``scaled_dot_product_attention``) or auto (sdpa on CUDA, host on CPU)."""
    packed_attention: str = "auto"
    """Kernel of the sdpa attention for packed rows (``segment_ids``): auto (varlen flash
    attention on CUDA in bf16/fp16, else FlexAttention on CUDA, else the dense mask),
    varlen, flex or dense; see :mod:`odc_pp.megatron.packed_attention`."""
    fused_cross_entropy: str = "auto"
    """Output layer + loss over token chunks without the full logits
    (:mod:`odc_pp.megatron.linear_cross_entropy`): auto (CUDA), on or off."""
    fused_swiglu: str = "auto"
    """SwiGLU by the Triton kernels of :mod:`odc_pp.megatron.swiglu_triton`: auto (CUDA,
    where they run), on (an error where they cannot) or off."""
    fused_rope: str = "auto"
    """RoPE by the Triton kernels of :mod:`odc_pp.megatron.rope_triton`, inside the SDPA
    core attention: auto (CUDA, where they run, without Transformer Engine's fused RoPE
    and context parallelism), on (an error where they cannot) or off."""

    def __post_init__(self) -> None:
        if self.kv_channels is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} must be divisible by "
                             f"num_attention_heads {self.num_attention_heads}")
        groups = self.num_query_groups or self.num_attention_heads
        if self.num_attention_heads % groups:
            raise ValueError(f"num_attention_heads {self.num_attention_heads} must be "
                             f"divisible by num_query_groups {groups}")
        for name, allowed in (("normalization", NORMALIZATIONS), ("activation", ACTIVATIONS),
                              ("position_embedding_type", POSITION_EMBEDDINGS),
                              ("attention_backend", ATTENTION_BACKENDS),
                              ("packed_attention", PACKED_KERNELS),
                              ("fused_cross_entropy", FUSED_CROSS_ENTROPY),
                              ("fused_swiglu", FUSED_CROSS_ENTROPY),
                              ("fused_rope", FUSED_CROSS_ENTROPY)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got "
                                 f"{getattr(self, name)!r}")
        if self.rope_scaling is not None:
            needed = {"factor", "low_freq_factor", "high_freq_factor",
                      "original_max_position_embeddings"}
            if not needed <= set(self.rope_scaling):
                raise ValueError(f"rope_scaling needs {sorted(needed)}, got "
                                 f"{sorted(self.rope_scaling)}")
        float_dtype(self.params_dtype, what="params_dtype")
        if self.recompute_method not in (None, "uniform", "block"):
            raise ValueError(f"recompute_method must be uniform, block or None, got "
                             f"{self.recompute_method!r}")
        if self.recompute_num_layers < 1:
            raise ValueError("recompute_num_layers must be >= 1")
        for name in ("vocab_size", "hidden_size", "num_layers", "max_sequence_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")

    @property
    def dtype(self) -> torch.dtype:
        return float_dtype(self.params_dtype, what="params_dtype")

    @property
    def core_attention(self) -> str:
        """The core attention the spec plugs in (``host`` or ``sdpa``)."""
        if self.attention_backend != "auto":
            return self.attention_backend
        return "sdpa" if torch.device(self.device).type == "cuda" else "host"
