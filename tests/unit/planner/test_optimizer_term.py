"""The planner's optimizer-step term (issue 31, Deliver 2): a rank's fused AdamW over its
owned shard, streamed at the GPU's memory bandwidth, is part of the predicted step (the
breakdown still sums to it), shrinks with tp x pp x dp, and is 0 where the bandwidth is
unknown. Its one constant (STREAM_EFFICIENCY) was calibrated on the H200 profile of the
8B-shaped step; the test re-reads that record, so a changed record or formula shows."""

from __future__ import annotations

import dataclasses
import json
import pathlib

import numpy as np
import pytest

from odc_pp.planner.config import Candidate, PlanConfig
from odc_pp.planner.hardware import OPTIMIZER_BYTES_PER_PARAM, PRESETS
from odc_pp.planner.inputs import ModelSpec
from odc_pp.planner.search import predict

ROOT = pathlib.Path(__file__).resolve().parents[3]
MODEL = ModelSpec(num_layers=4, hidden_size=512, num_attention_heads=8, seq_length=1024,
                  vocab_size=8192)


def _config(cluster) -> PlanConfig:
    return PlanConfig(model=MODEL, cluster=cluster, gpus=4, global_batch=16,
                      lengths=np.full(64, 1024), tp_sizes=(1,), schedules=("1f1b",))


def _candidate(pp: int, dp: int) -> Candidate:
    return Candidate(tp=1, pp=pp, dp=dp, schedule="1f1b", dp_mode="odc", balance="none",
                     packed=False, token_cap=None)


def test_the_step_includes_the_optimizer_of_the_owned_shard():
    h200 = PRESETS["h200"]
    config = _config(h200)
    pred = predict(config, _candidate(pp=2, dp=2))
    owned = MODEL.params() / (2 * 2)
    assert pred.breakdown["optimizer"] == pytest.approx(h200.optimizer_seconds(owned))
    assert pred.breakdown["optimizer"] > 0
    assert sum(pred.breakdown.values()) == pytest.approx(pred.step_s, rel=1e-9)
    unknown = predict(_config(dataclasses.replace(h200, memory_gbps=None)),
                      _candidate(pp=2, dp=2))
    assert unknown.breakdown["optimizer"] == 0.0
    # the rest of the difference: the embedding's and output layer's main_grad adds
    # (test below), also streamed at the known bandwidth
    pipeline = [sum(pred.breakdown[k] for k in ("compute", "bubble", "dp_wait", "comm"))
                for pred in (pred, unknown)]
    assert pred.step_s - unknown.step_s == pytest.approx(
        pred.breakdown["optimizer"] + pipeline[0] - pipeline[1])
    assert pipeline[0] > pipeline[1]
    wider = predict(config, _candidate(pp=4, dp=1))
    assert wider.breakdown["optimizer"] == pytest.approx(pred.breakdown["optimizer"])


def test_calibration_matches_the_h200_profile():
    record = json.loads((ROOT / "benchmarks/results/gpu_step_h200.json").read_text())
    profile = record["earlier_runs"]["full-1f1b-profile-run6"]["profile"]
    measured_s = profile["category_ms"]["optimizer"] / 1e3
    shape = record["shape"]  # 4 layers of Llama-3-8B, untied 128256 vocabulary, pp=1 dp=1
    h, f, v = shape["hidden_size"], shape["ffn_hidden_size"], shape["vocab_size"]
    kv = h // shape["num_attention_heads"] * shape["num_query_groups"]
    params = shape["num_layers"] * (2 * h * h + 2 * h * kv + 3 * h * f + 2 * h) + 2 * v * h + h
    predicted_s = PRESETS["h200"].optimizer_seconds(params)
    assert predicted_s == pytest.approx(measured_s, rel=0.05)
    assert OPTIMIZER_BYTES_PER_PARAM * params / measured_s / 1e12 == pytest.approx(2.8, rel=0.05)


def test_the_embedding_and_output_layer_add_their_gradients_into_main_grad():
    """Per microbatch, the first stage's W also streams the embedding's dense gradient
    into the fp32 main_grad, and the last stage's W the output layer's bf16 product
    (memory-bound, at the same efficiency as the optimizer); middle stages pay neither,
    and an unknown bandwidth leaves both out."""
    from odc_pp.planner.hardware import EMBEDDING_GRAD_BYTES, OUTPUT_GRAD_BYTES
    from odc_pp.planner.search import pipeline_costs

    h200 = PRESETS["h200"]
    cand = Candidate(tp=1, pp=4, dp=1, schedule="1f1b", dp_mode="odc", balance="none",
                     packed=False, token_cap=None)
    costs = pipeline_costs(_config(h200), cand)
    blind = pipeline_costs(_config(dataclasses.replace(h200, memory_gbps=None)), cand)
    table = MODEL.vocab_size * MODEL.hidden_size
    assert costs.t_w[1] == costs.t_w[2] == blind.t_w[1]
    assert costs.t_w[0] - blind.t_w[0] == pytest.approx(
        h200.stream_seconds(table * EMBEDDING_GRAD_BYTES))
    assert costs.t_w[3] - blind.t_w[3] == pytest.approx(
        h200.stream_seconds(table * OUTPUT_GRAD_BYTES))
    assert costs.t_w[0] > costs.t_w[1] and costs.t_f == blind.t_f
