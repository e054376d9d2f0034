"""The activation bytes of one transformer layer, per token, as the FakeTensor dry run
measured them for each kind of layer ``pretrain_gpt.py`` builds (issue 48: one
activation model, measured, not fitted).

The table is the data file ``layer_activations.json`` beside this module, written by
``tools/measure_layer_activations.py`` (``odc_pp.training.layer_measure``): for every
:class:`LayerKind` it ran one decoder layer of a middle pipeline stage (the stage with
one layer and with two, the difference) through the dry run's machinery -- the real
chunk on fake tensors under ``MemTracker``, F then B with the weight gradients deferred
-- at small shapes, and solved exactly for the bytes per token as a linear function of
the layer's widths::

    bytes/token = c_h h + c_ffn f + c_kv k + c_heads a + c_seq_heads s a + c_one
                  (+ c_head_dim h / a with RoPE: its cos/sin tables)

(h hidden, f MLP width, k key/value width (``num_query_groups x kv_channels``; GQA kinds
only: under MHA it is h), a heads, s the sequence length; the ``s a`` term is the
attention scores of the unfused attention, the ``a`` term the softmax statistics of the
flash kernel). A further shape checks the solution (``max_error``). Under tensor
parallelism the part that is not split was measured at tp = 2, with and without
sequence parallelism, as ``r_h h + r_one`` (``+ r_head_dim h / a`` with RoPE)
(:meth:`KindBytes.per_token`).

The table's GQA rows are measured at two query groups per tensor-parallel rank or more;
with one (multi-query, or as many groups as tp) the query is a view of the qkv
projection's output, not a copy, and a layer without RoPE (whose attention keeps that
query; RoPE keeps the rotated one either way) keeps ``2 q / tp`` bytes per token fewer
(:func:`odc_pp.planner.memory.saved_bytes_per_token` subtracts them; measured by
``tests/unit/training/test_layer_table.py``).

Two quantities per kind: ``saved`` (held from the layer's F to its B) and ``w_held``
(held from its B to its W: the inputs and output gradients of the deferred weight
gradients). Everything bf16 (2-byte activations; other widths scale linearly).
"""

from __future__ import annotations

import functools
import itertools
import json
import pathlib
from dataclasses import dataclass

__all__ = ["LayerKind", "KindBytes", "layer_kind", "kind_bytes", "table", "TABLE_PATH",
           "FEATURES", "RECOMPUTE_KINDS", "all_kinds"]

TABLE_PATH = pathlib.Path(__file__).with_name("layer_activations.json")
"""The measured table (``tools/measure_layer_activations.py`` writes it)."""

FEATURES = ("h", "ffn", "kv", "heads", "seq_heads", "one", "head_dim")
"""The per-token terms of a kind's bytes (module docstring)."""

RECOMPUTE_KINDS = ("none", "lgd", "full")
"""What a layer recomputes in B: nothing, norms/activation/hidden dropout
(``--recompute-lgd``; Megatron's selective recompute maps to it), or everything
(``--recompute-full``: per layer of a group of one, the group keeping only its input)."""


_FULL = {"normalization": "LayerNorm", "position": "learned_absolute", "flash": True,
         "hidden_dropout": False}
"""The one kind full recompute is measured as, per MLP and attention (it keeps the
layer's input from F to B; W's tensors are the linears')."""


@dataclass(frozen=True, kw_only=True)
class LayerKind:
    """What decides the tensors one decoder layer keeps (the table's key)."""

    mlp: str = "gelu"
    """gelu, or swiglu (``--swiglu``)."""
    normalization: str = "LayerNorm"
    """LayerNorm or RMSNorm (``--normalization``)."""
    position: str = "learned_absolute"
    """learned_absolute or rope (``--position-embedding-type``): RoPE keeps the rotated
    queries and keys."""
    attention: str = "mha"
    """mha, or gqa (``--group-query-attention``: fewer key/value heads)."""
    flash: bool = True
    """Fused attention (``--attention-backend sdpa``, flash kernels on GPUs; keeps no
    ``s x s`` scores); False: megatron's unfused attention (``host``)."""
    hidden_dropout: bool = True
    """``--hidden-dropout`` > 0 (Megatron's default 0.1); with the unfused attention also
    ``--attention-dropout`` > 0 (its probabilities' mask; measured with both at 0.1). The
    flash kernels keep only their random state for attention dropout."""
    recompute: str = "none"
    """One of :data:`RECOMPUTE_KINDS`."""

    def __post_init__(self) -> None:
        for name, allowed in (("mlp", ("gelu", "swiglu")),
                              ("normalization", ("LayerNorm", "RMSNorm")),
                              ("position", ("learned_absolute", "rope")),
                              ("attention", ("mha", "gqa")), ("recompute", RECOMPUTE_KINDS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"layer kind: {name} must be one of {allowed}, got "
                                 f"{getattr(self, name)!r}")
        if self.recompute == "full":  # F keeps the layer's input, W the linears' tensors:
            for name, value in _FULL.items():  # the norm, positions, attention kernel and
                object.__setattr__(self, name, value)  # dropout change neither

    @property
    def key(self) -> str:
        """The table's key, e.g. ``gelu/LayerNorm/learned_absolute/gqa/flash/dropout/lgd``."""
        core = "flash" if self.flash else "unfused"
        return "/".join((self.mlp, self.normalization, self.position, self.attention, core,
                         "dropout" if self.hidden_dropout else "no-dropout", self.recompute))

    @classmethod
    def from_key(cls, key: str) -> "LayerKind":
        mlp, norm, position, attention, core, dropout, recompute = key.split("/")
        return cls(mlp=mlp, normalization=norm, position=position, attention=attention,
                   flash=core == "flash", hidden_dropout=dropout == "dropout", recompute=recompute)


def all_kinds() -> list[LayerKind]:
    """Every kind the table holds (the measuring tool's list), the most used first: flash
    attention before the unfused one, full recompute last."""
    out = {}
    for mlp, norm, position, attention, flash, dropout, recompute in itertools.product(
            ("gelu", "swiglu"), ("LayerNorm", "RMSNorm"), ("learned_absolute", "rope"),
            ("mha", "gqa"), (True, False), (True, False), RECOMPUTE_KINDS):
        kind = LayerKind(mlp=mlp, normalization=norm, position=position, attention=attention,
                         flash=flash, hidden_dropout=dropout, recompute=recompute)
        out[kind.key] = kind
    def priority(k: LayerKind) -> tuple:  # GPT's and Llama's kinds first, full, the rest
        gpt = (k.mlp, k.normalization, k.position) == ("gelu", "LayerNorm", "learned_absolute")
        llama = (k.mlp, k.normalization, k.position) == ("swiglu", "RMSNorm", "rope")
        return (not k.flash, not (gpt or llama) and k.recompute != "full",
                k.recompute != "full")
    return sorted(out.values(), key=priority)


def layer_kind(model, *, flash: bool, recompute: bool | str) -> LayerKind:
    """The kind of the layers of ``model`` (a :class:`~odc_pp.planner.model.ModelShape`)
    run with or without ``flash`` attention and ``recompute`` (True: lgd, False: none, or
    one of :data:`RECOMPUTE_KINDS`)."""
    if isinstance(recompute, bool):
        recompute = "lgd" if recompute else "none"
    dropout = model.hidden_dropout > 0 or (not flash and model.attention_dropout > 0)
    return LayerKind(mlp="swiglu" if model.gated_mlp else "gelu",
                     normalization=model.normalization,
                     position=model.position_embedding_type,
                     attention="mha" if model.query_groups == model.num_attention_heads
                     else "gqa", flash=flash, hidden_dropout=dropout, recompute=recompute)


@dataclass(frozen=True)
class KindBytes:
    """One kind's measured coefficients (bytes per token, bf16) of one quantity."""

    total: dict[str, float]
    """At tp = 1, per :data:`FEATURES` entry."""
    replicated_sp: dict[str, float]
    """The part not split over tp with sequence parallelism (``h``, ``one`` and, with
    RoPE, ``head_dim`` terms)."""
    replicated: dict[str, float]
    """The part not split over tp without sequence parallelism (the same terms)."""

    def per_token(self, *, h: int, ffn: int, kv: int, heads: int, seq: int, tp: int = 1,
                  sequence_parallel: bool = True) -> float:
        """Bytes per token of one layer on one tensor-parallel rank."""
        values = {"h": h, "ffn": ffn, "kv": kv, "heads": heads, "seq_heads": seq * heads,
                  "one": 1, "head_dim": h // heads}
        total = sum(c * values[name] for name, c in self.total.items())
        if tp == 1:
            return total
        part = self.replicated_sp if sequence_parallel else self.replicated
        kept = sum(c * values[name] for name, c in part.items())
        return (total - kept) / tp + kept


@functools.lru_cache(maxsize=1)
def table() -> dict:
    """The measured table (:data:`TABLE_PATH`)."""
    try:
        return json.loads(TABLE_PATH.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ValueError(f"{TABLE_PATH}: the measured layer table is missing; write it with "
                         f"tools/measure_layer_activations.py") from exc


def kind_bytes(kind: LayerKind, quantity: str = "saved") -> KindBytes:
    """The coefficients of ``quantity`` (saved or w_held) of ``kind``; a ValueError naming
    the kind and the table when it was not measured."""
    entry = table()["kinds"].get(kind.key)
    if entry is None:
        raise ValueError(f"layer kind {kind.key} is not in {TABLE_PATH.name}; measure it "
                         f"with tools/measure_layer_activations.py")
    row = entry[quantity]
    return KindBytes(total=row["total"], replicated_sp=row["replicated_sp"],
                     replicated=row["replicated"])

