"""The transformer's shape, the one description of it the planner (``odc-pp plan``), the
offload tuner (``odc-pp tune-offload``) and training's throughput/MFU log share.

Megatron's meaning for every field (``--num-layers``, ``--hidden-size``,
``--ffn-hidden-size``, ``--num-attention-heads``, ``--num-query-groups``,
``--kv-channels``, ``--swiglu``, ``--untie-embeddings-and-output-weights``). FLOPs are
:func:`odc_pp.schedule.costs.transformer_layer_flops` (Megatron-LM's formula: SwiGLU's
``3 h f``, GQA's smaller K/V projections)."""

from __future__ import annotations

from dataclasses import dataclass

from odc_pp.schedule.costs import transformer_layer_flops

__all__ = ["ModelShape", "layer_fields"]

_LAYER_DEFAULTS = {"normalization": "LayerNorm", "position_embedding_type": "learned_absolute",
                   "hidden_dropout": 0.1, "attention_dropout": 0.1}
"""Megatron's defaults of the flags that decide a layer's kind beside its widths."""


def layer_fields(model) -> dict:
    """The layer-kind fields of :class:`ModelShape` from Megatron model flags (an object
    with their attribute names; missing ones: Megatron's defaults)."""
    values = {name: getattr(model, name, None) for name in _LAYER_DEFAULTS}
    return {name: default if values[name] is None else values[name]
            for name, default in _LAYER_DEFAULTS.items()}


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """A GPT's shape (no sequence length: that is the workload's)."""

    num_layers: int
    """Transformer layers L."""
    hidden_size: int
    """Hidden size h."""
    vocab_size: int
    """(Padded) vocabulary V: the embedding's and the output layer's rows (0: leave the
    output layer out of the FLOPs, as sample assignment's per-sample cost does)."""
    ffn_hidden_size: int | None = None
    """MLP width f (SwiGLU: the intermediate size); None: 4 h, Megatron's default."""
    num_attention_heads: int = 1
    """Attention heads a."""
    num_query_groups: int | None = None
    """Key/value heads g (grouped-query attention); None: a (multi-head attention)."""
    kv_channels: int | None = None
    """Channels per head; None: h / a."""
    gated_mlp: bool = False
    """SwiGLU: fc1 has 2 f outputs, the MLP multiplies 3 h f weights instead of 2 h f."""
    tied: bool = True
    """The output layer shares the embedding's weight (Megatron's default; False:
    ``--untie-embeddings-and-output-weights``)."""
    normalization: str = "LayerNorm"
    """The layers' norm: LayerNorm (Megatron's default) or RMSNorm (``--normalization``)."""
    position_embedding_type: str = "learned_absolute"
    """learned_absolute (Megatron's default) or rope (``--position-embedding-type``)."""
    hidden_dropout: float = 0.1
    """``--hidden-dropout`` (Megatron's default 0.1): its masks are kept for backward."""
    attention_dropout: float = 0.1
    """``--attention-dropout`` (Megatron's default 0.1): the unfused attention keeps its
    mask; flash kernels keep only their random state."""

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size",
                     "num_query_groups", "kv_channels"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        if self.vocab_size < 0:
            raise ValueError(f"--vocab-size must be >= 0, got {self.vocab_size}")
        if self.kv_channels is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(f"--hidden-size {self.hidden_size} must be divisible by "
                             f"--num-attention-heads {self.num_attention_heads}")
        if self.normalization not in ("LayerNorm", "RMSNorm"):
            raise ValueError(f"--normalization must be LayerNorm or RMSNorm, got "
                             f"{self.normalization!r}")
        if self.position_embedding_type not in ("learned_absolute", "rope"):
            raise ValueError(f"--position-embedding-type must be learned_absolute or rope, "
                             f"got {self.position_embedding_type!r}")
        if self.num_attention_heads % self.query_groups:
            raise ValueError(f"--num-attention-heads {self.num_attention_heads} must be "
                             f"divisible by --num-query-groups {self.query_groups}")

    @classmethod
    def of(cls, model, vocab_size: int) -> "ModelShape":
        """The shape of Megatron model flags (an object with their attribute names, e.g.
        :class:`~odc_pp.training.arguments.ModelArgs`; ``untie_embeddings``:
        --untie-embeddings-and-output-weights) with ``vocab_size`` rows."""
        gqa = bool(getattr(model, "group_query_attention", False))
        return cls(num_layers=model.num_layers, hidden_size=model.hidden_size,
                   vocab_size=vocab_size, ffn_hidden_size=model.ffn_hidden_size,
                   num_attention_heads=model.num_attention_heads,
                   num_query_groups=model.num_query_groups if gqa else None,
                   kv_channels=getattr(model, "kv_channels", None),
                   gated_mlp=bool(getattr(model, "swiglu", False)),
                   tied=not getattr(model, "untie_embeddings", False),
                   **layer_fields(model))

    @property
    def ffn(self) -> int:
        """MLP width f."""
        return 4 * self.hidden_size if self.ffn_hidden_size is None else self.ffn_hidden_size

    @property
    def query_groups(self) -> int:
        return self.num_attention_heads if self.num_query_groups is None \
            else self.num_query_groups

    @property
    def query_width(self) -> int:
        """Heads x kv_channels (q: the query projection's width)."""
        channels = self.kv_channels or self.hidden_size // self.num_attention_heads
        return self.num_attention_heads * channels

    @property
    def kv_width(self) -> int:
        """Query groups x kv_channels (k: the width of K and of V)."""
        return self.query_width // self.num_attention_heads * self.query_groups

    def megatron_flags(self) -> list[str]:
        """The Megatron flags of this shape (vocabulary: the data's, not repeated)."""
        out = ["--num-layers", str(self.num_layers), "--hidden-size", str(self.hidden_size),
               "--num-attention-heads", str(self.num_attention_heads)]
        if self.ffn_hidden_size is not None:
            out += ["--ffn-hidden-size", str(self.ffn_hidden_size)]
        if self.num_query_groups is not None:
            out += ["--group-query-attention", "--num-query-groups", str(self.num_query_groups)]
        if self.kv_channels is not None:
            out += ["--kv-channels", str(self.kv_channels)]
        if self.gated_mlp:
            out.append("--swiglu")
        if not self.tied:
            out.append("--untie-embeddings-and-output-weights")
        for name, default in _LAYER_DEFAULTS.items():
            if getattr(self, name) != default:
                out += [f"--{name.replace('_', '-')}", f"{getattr(self, name):g}"
                        if isinstance(default, float) else getattr(self, name)]
        return out

    def layer_flops(self, batch: int, seq: int) -> tuple[float, float, float]:
        """F, B and W FLOPs of one layer on a ``[batch, seq]`` microbatch."""
        return transformer_layer_flops(batch, seq, self.hidden_size, self.ffn,
                                       query_width=self.query_width, kv_width=self.kv_width,
                                       gated_mlp=self.gated_mlp)

    def executed_layer_flops(self, batch: int, seq: int) -> tuple[float, float, float]:
        """F, B and W FLOPs one layer executes on a ``[batch, seq]`` microbatch: causal
        attention does half of :meth:`layer_flops`' attention (the planner's times; MFU
        keeps :meth:`layer_flops`)."""
        return transformer_layer_flops(batch, seq, self.hidden_size, self.ffn,
                                       query_width=self.query_width, kv_width=self.kv_width,
                                       gated_mlp=self.gated_mlp, causal=True)

    def layer_params(self) -> int:
        """Weights of one layer: Q and output projections ``2 h q``, K and V ``2 h k``, the
        MLP ``2 h f`` (``3 h f`` gated), two norms with weight and bias ``4 h`` (linear
        biases, small, not counted)."""
        h = self.hidden_size
        mlp = (3 if self.gated_mlp else 2) * h * self.ffn
        return 2 * h * self.query_width + 2 * h * self.kv_width + mlp + 4 * h

    def params(self) -> int:
        """Every weight: the layers, the embedding and (untied) the output layer."""
        embeddings = (1 if self.tied else 2) * self.vocab_size * self.hidden_size
        return self.num_layers * self.layer_params() + embeddings
