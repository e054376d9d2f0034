"""Per-GPU-kind compute efficiency (issue 48, Deliver 4): each preset's ``mfu`` and
``half_efficiency_tokens`` are recomputed here from the measurements they were calibrated
on (odc_pp.planner.efficiency), so a changed record, FLOPs formula or preset shows. The
parent had one constant, 0.45 with half efficiency at 1024 tokens, for every kind."""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib

import numpy as np
import pytest

from odc_pp.planner.config import Candidate, PlanConfig
from odc_pp.planner.efficiency import fit_curve, layer_fraction, solve_mfu
from odc_pp.planner.hardware import PRESETS
from odc_pp.planner.inputs import ModelSpec
from odc_pp.planner.search import predict
from odc_pp.schedule.costs import transformer_layer_flops

ROOT = pathlib.Path(__file__).resolve().parents[3]


def _a100_points() -> list[tuple[float, float]]:
    """(tokens per microbatch, fraction of peak) of a layer's F + B + W in each row of the
    zero-bubble paper's Table 9 (a middle stage: ceil(L / pp) layers), of the FLOPs the
    layer executes (causal attention: half the formula's), as the planner times passes."""
    tables = json.loads((ROOT / "benchmarks/data/zb_paper_tables.json").read_text())
    points = []
    for row in tables["table5"]:
        shape = tables["table3_shapes"][row["model"]]
        b, s, h = shape["microbatch_size"], tables["table3_seq_length"], shape["hidden_size"]
        layers = math.ceil(tables["table3_layers"][row["model"]] / row["pp"])
        seconds = (row["t_f"] + row["t_b"] + row["t_w"]) / layers / 1e3
        flops = sum(transformer_layer_flops(b, s, h, 4 * h, causal=True))
        points.append((b * s, layer_fraction(flops, seconds, PRESETS["a100"].peak_tflops)))
    return points


def _step_mfu(kind: str, half: float) -> float:
    """The mfu at which the planner predicts the measured step of the GPU-step record's
    full-1f1b run (one GPU, 8 x 8192 tokens)."""
    record = json.loads((ROOT / f"benchmarks/results/gpu_step_{kind}.json").read_text())
    shape, run = record["shape"], record["runs"]["full-1f1b"]
    model = ModelSpec(num_layers=shape["num_layers"], hidden_size=shape["hidden_size"],
                      ffn_hidden_size=shape["ffn_hidden_size"],
                      num_attention_heads=shape["num_attention_heads"],
                      num_query_groups=shape["num_query_groups"],
                      vocab_size=shape["vocab_size"], gated_mlp=True, tied=False,
                      seq_length=shape["seq_length"])
    cand = Candidate(tp=1, pp=1, dp=1, schedule="1f1b", dp_mode="odc", balance="none",
                     packed=False, token_cap=None)

    def step_at(mfu: float) -> float:
        cluster = dataclasses.replace(PRESETS[kind], mfu=mfu, half_efficiency_tokens=half)
        config = PlanConfig(model=model, cluster=cluster, gpus=1,
                            global_batch=shape["global_batch_size"],
                            lengths=np.full(64, shape["seq_length"]), tp_sizes=(1,),
                            schedules=("1f1b",))
        return predict(config, cand).step_s
    return solve_mfu(step_at, run["step_s"])


def test_a100_from_the_zero_bubble_papers_table9():
    points = _a100_points()
    assert len(points) == 12
    # the data: ~0.62 at 1024 tokens (h >= 5120) as at 3072 (h 4096): no loss at 1024
    assert min(f for t, f in points if t == 1024) > 0.61
    mfu, half = fit_curve(points)
    a100 = PRESETS["a100"]
    assert (a100.mfu, a100.half_efficiency_tokens) == (round(mfu, 3), half)
    assert 0.55 < mfu < 0.65 and half == 0.0
    # the parent's curve (0.45, half at 1024) was 2x low at 1024 tokens
    assert all(0.45 * t / (t + 1024) < 0.6 * f for t, f in points if t == 1024)


@pytest.mark.parametrize("kind", ["h100", "h200"])
def test_h100_h200_from_the_gpu_step_records(kind):
    half = PRESETS["a100"].half_efficiency_tokens  # the one measured curve shape
    mfu = _step_mfu(kind, half)
    preset = PRESETS[kind]
    assert (preset.mfu, preset.half_efficiency_tokens) == (round(mfu, 3), half)
    assert preset.mfu != 0.45


def test_solve_mfu_inverts_an_affine_step():
    assert solve_mfu(lambda mfu: 2.0 / mfu + 0.5, 4.5) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="no compute time"):
        solve_mfu(lambda mfu: 2.0 / mfu + 0.5, 0.4)
