"""Pass times count the FLOPs the kernels execute (causal attention skips the masked half)
while MFU keeps Megatron-LM's formula (issue 48, Deliver 4): at long sequences the
predicted MFU rises with the length, as PipeOffload's Figure 15 measured."""

from __future__ import annotations

import numpy as np

from odc_pp.planner.config import Candidate, PlanConfig
from odc_pp.planner.hardware import PRESETS
from odc_pp.planner.inputs import ModelSpec
from odc_pp.planner.search import predict
from odc_pp.schedule.costs import transformer_layer_flops


def test_causal_attention_executes_half_of_the_formulas():
    b, s, h, f = 2, 4096, 1024, 4096
    formula = transformer_layer_flops(b, s, h, f)
    executed = transformer_layer_flops(b, s, h, f, causal=True)
    dense = transformer_layer_flops(b, 1, h, f)[2] * s  # W: no attention term
    attention = 4 * b * s * s * h
    assert formula == (dense + attention, dense + 2 * attention, dense)
    assert executed == (dense + attention / 2, dense + attention, dense)


def _mfu(seq: int) -> float:
    model = ModelSpec(num_layers=4, hidden_size=1024, num_attention_heads=8,
                      ffn_hidden_size=4096, vocab_size=32000, seq_length=seq)
    config = PlanConfig(model=model, cluster=PRESETS["a100"], gpus=1, global_batch=4,
                        lengths=np.full(16, seq), tp_sizes=(1,), schedules=("1f1b",),
                        samples=1)
    cand = Candidate(tp=1, pp=1, dp=1, schedule="1f1b", dp_mode="odc", balance="none",
                     packed=False, token_cap=None)
    return predict(config, cand).mfu


def test_predicted_mfu_rises_with_the_sequence_length():
    short, long = _mfu(1024), _mfu(32768)
    # formula FLOPs over executed-FLOPs time: above the preset's efficiency at 32K
    # (attention dominates), about it at 1K (dense layers dominate)
    assert long > PRESETS["a100"].mfu * 1.3
    assert long > short * 1.3
