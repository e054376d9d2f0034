"""One activation model, measured (issue 48): the per-layer bytes the planner, the dry
run's memory model and tune-offload read (``odc_pp/planner/layer_activations.json``) are
what the FakeTensor dry run measures for the layer's kind -- re-measured here, so a
stale or wrong table fails -- and a GeLU/LayerNorm layer is charged its own bytes, not a
SwiGLU/RMSNorm layer's (before: 27.8 h per token for PipeOffload's GPT layers, whose
dry run keeps 18.8 h)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from odc_pp.planner.layer_kinds import LayerKind, kind_bytes, layer_kind
from odc_pp.planner.memory import Workload, layer_activation_bytes, saved_bytes_per_token
from odc_pp.planner.model import ModelShape
from odc_pp.training.layer_measure import CHECK_SHAPE, LayerShape, measure_layer

GPT_LGD = "gelu/LayerNorm/learned_absolute/gqa/flash/dropout/lgd"
"""PipeOffload's GPT layers: GeLU, LayerNorm, GQA, dropout; LayerNorm/GeLU/dropout
recomputed (--recompute-lgd)."""
LLAMA = "swiglu/RMSNorm/rope/gqa/flash/no-dropout/none"
PAPER = LayerShape(h=5120, heads=40, groups=8, seq=4096, ffn=20480)
"""A layer of PipeOffload's 10.5B model (GQA with 8 groups)."""
SMALL = LayerShape(h=1280, heads=10, groups=2, seq=512, ffn=5120)
TP4 = LayerShape(h=1024, heads=16, groups=8, seq=256, ffn=2048)  # 2 groups per rank


def _table(kind: LayerKind, shape: LayerShape, quantity: str, **tp) -> float:
    """The one model's bytes per token (planner.memory, reading the table)."""
    gqa = kind.attention == "gqa"
    model = ModelShape(num_layers=1, hidden_size=shape.h, num_attention_heads=shape.heads,
                       num_query_groups=shape.groups if gqa else None,
                       ffn_hidden_size=shape.ffn, vocab_size=0,
                       gated_mlp=kind.mlp == "swiglu", normalization=kind.normalization,
                       position_embedding_type=kind.position,
                       hidden_dropout=0.1 if kind.hidden_dropout else 0.0,
                       attention_dropout=0.1 if kind.hidden_dropout else 0.0)
    assert layer_kind(model, flash=kind.flash, recompute=kind.recompute) == kind
    return saved_bytes_per_token(model, seq_length=shape.seq, flash=kind.flash,
                                 recompute=kind.recompute, quantity=quantity, **tp)


@pytest.mark.parametrize("key, shape, tp", [
    (GPT_LGD, PAPER, {}), (GPT_LGD, CHECK_SHAPE, {}), (LLAMA, PAPER, {}),
    ("gelu/LayerNorm/learned_absolute/mha/flash/dropout/none", SMALL, {}),
    ("gelu/LayerNorm/learned_absolute/mha/unfused/dropout/none", SMALL, {}),
    ("swiglu/RMSNorm/rope/gqa/unfused/dropout/lgd", SMALL, {}),
    (GPT_LGD, TP4, {"tp": 2, "sequence_parallel": True}),
    (GPT_LGD, SMALL, {"tp": 2, "sequence_parallel": True}),
    (LLAMA, TP4, {"tp": 4, "sequence_parallel": True}),
    (LLAMA, TP4, {"tp": 2, "sequence_parallel": False}),
    (LLAMA, TP4, {"tp": 8, "sequence_parallel": True}),
    (GPT_LGD, LayerShape(h=640, heads=10, groups=1, seq=64, ffn=2560), {})],
    ids=["gpt-lgd-10.5B", "gpt-lgd-check", "llama-10.5B", "gpt-mha", "gpt-unfused",
         "rope-gqa-unfused", "gpt-lgd-tp2-sp", "gpt-lgd-tp2-one-group-per-rank",
         "llama-tp4-sp", "llama-tp2", "llama-tp8-one-group-per-rank", "gpt-mqa"])
def test_the_table_is_what_the_dry_run_measures(key, shape, tp):
    kind = LayerKind.from_key(key)
    saved, w_held = measure_layer(kind, shape, **tp)
    assert _table(kind, shape, "saved", **tp) == pytest.approx(saved, rel=0.005)
    assert _table(kind, shape, "w_held", **tp) == pytest.approx(w_held, rel=0.005)


def test_the_planner_charges_a_gelu_layernorm_layer_its_measured_bytes():
    gpt = ModelShape(num_layers=38, hidden_size=5120, num_attention_heads=40,
                     num_query_groups=8, vocab_size=50304)  # Megatron's defaults: GeLU...
    assert layer_kind(gpt, flash=True, recompute=True) == LayerKind.from_key(GPT_LGD)
    planner = layer_activation_bytes(Workload(model=gpt, seq_length=PAPER.seq), recompute=True)
    measured = measure_layer(LayerKind.from_key(GPT_LGD), PAPER)[0] * PAPER.seq
    assert planner == pytest.approx(measured, rel=0.02)
    assert planner / PAPER.seq / PAPER.h < 20  # PipeOffload App. C: 20 s b h, less with GQA
    llama_layer = replace(gpt, gated_mlp=True, normalization="RMSNorm",
                          position_embedding_type="rope", hidden_dropout=0.0,
                          attention_dropout=0.0)
    swiglu = layer_activation_bytes(Workload(model=llama_layer, seq_length=PAPER.seq),
                                    recompute=True)
    assert abs(swiglu - planner) > 0.05 * planner


def test_an_unmeasured_kind_is_refused_naming_the_table(monkeypatch):
    from odc_pp.planner import layer_kinds

    monkeypatch.setattr(layer_kinds, "table", lambda: {"kinds": {}})
    with pytest.raises(ValueError, match="layer_activations.json.*measure_layer_activations"):
        kind_bytes(LayerKind.from_key(GPT_LGD))
