"""``odc-pp tune-offload`` is a view of the planner (issue 31): the same candidates get
the same step and memory from ``odc-pp plan``'s model, and the planner prices activation
offload on the host link instead of dropping every offloading candidate."""

from dataclasses import replace

import numpy as np
import pytest

from odc_pp.planner.config import Candidate, PlanConfig
from odc_pp.planner.hardware import PRESETS
from odc_pp.planner.inputs import ModelSpec
from odc_pp.planner.memory import Workload
from odc_pp.planner.model import ModelShape
from odc_pp.planner.search import plan, predict

SHAPE = dict(num_layers=16, hidden_size=2048, num_attention_heads=16, vocab_size=32000)


def _plan_config(**changes) -> PlanConfig:
    model = ModelSpec(**SHAPE, seq_length=8192)
    return PlanConfig(**{"model": model, "cluster": PRESETS["h100"], "gpus": 4,
                         "global_batch": 8, "lengths": np.array([8192]), "tp_sizes": (1,),
                         "samples": 1, **changes})


def _offload(**changes) -> Candidate:
    return Candidate(**{"tp": 1, "pp": 4, "dp": 1, "schedule": "offload", "dp_mode": "odc",
                        "balance": "none", "packed": False, "token_cap": None, **changes})


def test_the_planner_prices_offload_on_the_host_link():
    """Every offloading candidate used to raise inside the simulator (no offload
    bandwidth) and was silently left out of the plan."""
    config = _plan_config()
    pred = predict(config, _offload())
    assert pred.flags[-4:] == ["--cpu-offload", "--offload-chunks", "0", "1"]
    slow = predict(_plan_config(cluster=replace(PRESETS["h100"], host_link_gbps=0.5)),
                   _offload())
    assert slow.step_s > 1.5 * pred.step_s  # a slow link leaves the transfers exposed
    # what an OFFLOAD moved out is not on the device: less than the same schedule kept
    kept = predict(config, Candidate(**{**vars(_offload()), "schedule": "interleaved"}))
    assert max(pred.peak_memory_gb) < max(kept.peak_memory_gb)
    ranked, _ = plan(config)
    assert any(p.candidate.offloaded for p in ranked)


def test_one_chunk_offloaded_sits_between_none_and_all():
    config = _plan_config()
    every, one = predict(config, _offload()), predict(config, _offload(offload_chunks=(0,)))
    assert "--offload-chunks 0 " in " ".join(one.flags) + " "
    kept = predict(config, Candidate(**{**vars(_offload()), "schedule": "interleaved"}))
    assert max(every.peak_memory_gb) <= max(one.peak_memory_gb) <= max(kept.peak_memory_gb)
    with pytest.raises(ValueError, match="--offload-chunks"):
        _offload(offload_chunks=(2,))
    with pytest.raises(ValueError, match="--offload-chunks"):
        Candidate(**{**vars(_offload()), "schedule": "zbv", "offload_chunks": (0,)})


def test_tune_offload_rows_are_the_plan_commands_predictions():
    """The same layout through ``odc-pp plan``'s search (every sample at --seq-length,
    tp and pp fixed) predicts each candidate both offer exactly as tune-offload ranks it:
    one cost model, one memory model."""
    from odc_pp.planner.offload_tuner import TunerConfig, candidates_of, plan_config, tune

    tuner = TunerConfig(shape=Workload(model=ModelShape(**SHAPE), seq_length=8192),
                        hardware=PRESETS["h100"], pp=4, num_microbatches=8,
                        memory_budget_gb=40)
    rows = {(c.schedule, c.num_chunks, c.offload_chunks, c.recompute): c for c in tune(tuner)}
    config = _plan_config(gpus=4, global_batch=8, memory_gb=40, dp_modes=("odc",))
    ranked, _ = plan(config)
    matched = 0
    for pred in ranked:
        cand = pred.candidate
        if cand.pp != 4 or cand.balance != "none" or cand.packed or not cand.dp_mode.is_odc:
            continue
        row = rows[(cand.schedule, cand.num_chunks, cand.offloaded, cand.recompute)]
        assert row.step_s == pytest.approx(pred.step_s, rel=1e-12)
        assert row.peak_memory_gb == pytest.approx(max(pred.peak_memory_gb), rel=1e-12)
        matched += 1
    assert matched >= 5  # 1f1b, interleaved, zb-h1, zb-h2, zbv, offload
    # and the view's own axes: every offload set, with and without recompute
    offloads = {c.offloaded for c in candidates_of(tuner)
                if c.schedule == "offload" and c.num_chunks == 2}
    assert offloads == {(0,), (1,), (0, 1)}
    assert plan_config(tuner).gpus == 4 and plan_config(tuner).global_batch == 8


def test_the_logits_are_counted_on_the_rank_holding_the_last_stage():
    """In a V placement the last stage is on rank 0: the planner's own estimate puts the
    fp32 logits there, not on the last pipeline rank."""
    from odc_pp.planner.rough_memory import chunk_activation_bytes, static_bytes
    from odc_pp.planner.search import _pipeline_link, _simulated

    config = _plan_config()
    for schedule, holder in (("zbv", 0), ("1f1b", 3)):
        cand = Candidate(**{**vars(_offload()), "schedule": schedule})
        pred = predict(config, cand)
        _, units, biggest, _, _ = _simulated(config, cand, _pipeline_link(config, cand))
        chunk = chunk_activation_bytes(config, cand, biggest)
        extra = [p * 1e9 - (s + u * chunk) for p, s, u in
                 zip(pred.peak_memory_gb, static_bytes(config, cand), units)]
        logits = biggest * SHAPE["vocab_size"] * 4
        assert extra[holder] == pytest.approx(logits, rel=1e-3), (schedule, extra)
        assert all(abs(e) < 1e-3 * logits for r, e in enumerate(extra) if r != holder)
