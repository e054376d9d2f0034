"""Row M's data parallelism (issue 49): the planner's ``ddp`` (Megatron's DDP with the
distributed optimizer) synchronises once per minibatch, as ODC does (the same compute,
bubble and dp wait for the same data), while ``collective`` runs in lock step at every
microbatch position; ddp's exposed traffic is the fp32 reduce-scatter beyond the last
microbatch's backward plus the bf16 parameter all-gather after the step."""

from __future__ import annotations

import numpy as np
import pytest

from odc_pp.planner.config import Candidate, PlanConfig
from odc_pp.planner.dp_traffic import DDP_GRAD_BYTES, PARAM_BYTES, dp_comm_seconds
from odc_pp.planner.hardware import PRESETS
from odc_pp.planner.inputs import ModelSpec
from odc_pp.planner.search import predict

MODEL = ModelSpec(num_layers=4, hidden_size=512, num_attention_heads=8, seq_length=4096,
                  vocab_size=8192)


def _config() -> PlanConfig:
    lengths = np.random.default_rng(0).integers(64, 4096, 256)  # long-tailed enough
    return PlanConfig(model=MODEL, cluster=PRESETS["h100"], gpus=4, global_batch=16,
                      lengths=lengths, tp_sizes=(1,), schedules=("1f1b",), samples=2)


def _cand(mode: str, balance: str = "none") -> Candidate:
    return Candidate(tp=1, pp=2, dp=2, schedule="1f1b", dp_mode=mode, balance=balance,
                     packed=False, token_cap=None)


def test_ddp_syncs_once_per_minibatch_and_collective_in_lock_step():
    config = _config()
    ddp, odc, fsdp = (predict(config, _cand(m)) for m in ("ddp", "odc", "collective"))
    for key in ("compute", "bubble", "dp_wait"):
        assert ddp.breakdown[key] == pytest.approx(odc.breakdown[key], rel=1e-12)
    pipeline = sum(ddp.breakdown[k] for k in ("compute", "bubble", "dp_wait"))
    lock_step = sum(fsdp.breakdown[k] for k in ("compute", "bubble", "dp_wait"))
    assert pipeline < lock_step  # unequal microbatches: lock step waits at every position
    assert sum(ddp.breakdown.values()) == pytest.approx(ddp.step_s, rel=1e-9)


def test_ddps_reduce_scatter_hides_behind_the_last_backward_and_the_gather_does_not():
    config = _config()
    cand = _cand("ddp")
    moved = 0.5 * MODEL.params() / 2 / (PRESETS["h100"].tp_link_gbps * 1e9)  # inside a node
    gather, scatter = moved * PARAM_BYTES, moved * DDP_GRAD_BYTES
    assert dp_comm_seconds(config, cand, 0.0) == pytest.approx(gather + scatter)
    assert dp_comm_seconds(config, cand, scatter / 2) == pytest.approx(gather + scatter / 2)
    assert dp_comm_seconds(config, cand, 10 * scatter) == pytest.approx(gather)
    pred = predict(config, cand)
    assert gather <= pred.breakdown["comm"] <= gather + scatter
