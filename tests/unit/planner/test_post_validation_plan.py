"""Post-validated zero-bubble candidates in the planner (issue 48, Deliver 4: iterations
overlapped in steady state where the schedule allows it): the minibatch costs the
schedule's steady period, not one iteration's makespan; the printed flags carry
--enable-optimizer-post-validation (never for --fp16, which the trainer refuses with it);
the planner's own memory estimate counts the snapshot."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from odc_pp.planner import post_validation, rough_memory, search
from odc_pp.planner.config import Candidate, PlanConfig
from odc_pp.planner.hardware import PRESETS
from odc_pp.planner.inputs import ModelSpec
from odc_pp.schedule.steady_state import repeat
from odc_pp.schedule.simulator import simulate

MODEL = ModelSpec(num_layers=8, hidden_size=512, num_attention_heads=8, seq_length=1024,
                  vocab_size=8192)


def _config(model: ModelSpec = MODEL) -> PlanConfig:
    return PlanConfig(model=model, cluster=PRESETS["a100"], gpus=4, global_batch=12,
                      lengths=np.full(64, 1024), tp_sizes=(1,), schedules=("zb-h2",))


def _candidate(schedule: str) -> Candidate:
    return Candidate(tp=1, pp=4, dp=1, schedule=schedule, dp_mode="odc", balance="none",
                     packed=False, token_cap=None)


def test_post_validated_step_is_the_steady_period(monkeypatch):
    """ZB-H2 at pp 4: the predicted minibatch is the steady period (three copies back to
    back, recomputed here) and shorter than the makespan the parent charged."""
    config, cand = _config(), _candidate("zb-h2")
    assert post_validation.post_validated(config, cand)
    pred = search.predict(config, cand)
    shapes = next(iter(search.drawn_plans(config, cand,
                                          search.sample_cost(config.model)))).shapes[0]
    costs = search.replica_costs(config, cand, shapes, search._pipeline_link(config, cand),
                                 search.memory_units(config, cand))
    sim, schedule = search.pipeline_time(search.request_of(cand, len(shapes)), costs)
    tiled = dataclasses.replace(costs, microbatch_scale=tuple(costs.microbatch_scale) * 3)
    period = (simulate(repeat(schedule, 3), tiled).makespan - sim.makespan) / 2
    assert period < sim.makespan * 0.97
    step = pred.breakdown["compute"] + pred.breakdown["bubble"] + pred.breakdown["dp_wait"]
    assert step == pytest.approx(period, rel=1e-9)
    assert pred.breakdown["bubble"] == pytest.approx(period - max(sim.busy), rel=1e-9)
    monkeypatch.setattr(search, "post_validated", lambda *_: False)
    config.memo.clear()
    synchronous = search.predict(config, cand)
    assert synchronous.step_s - pred.step_s == pytest.approx(sim.makespan - period, rel=1e-6)


def test_flags_name_post_validation_only_where_iterations_overlap():
    config = _config()
    for schedule in ("zb-h2", "zbv"):
        assert post_validation.FLAG in search.flags_of(config, _candidate(schedule))
    for schedule in ("1f1b", "zb-h1", "interleaved"):
        assert post_validation.FLAG not in search.flags_of(config, _candidate(schedule))
    fp16 = ModelSpec(num_layers=8, hidden_size=512, num_attention_heads=8, seq_length=1024,
                     vocab_size=8192, source_flags=("--num-layers", "8", "--hidden-size",
                                                    "512", "--num-attention-heads", "8",
                                                    "--seq-length", "1024", "--fp16"))
    assert post_validation.FLAG not in search.flags_of(_config(fp16), _candidate("zb-h2"))


def test_rough_memory_counts_the_snapshot(monkeypatch):
    """16 bytes per owned parameter (fp32 master, two Adam moments, fp32 gradient)."""
    config, cand = _config(), _candidate("zb-h2")
    with_snapshot = rough_memory.static_bytes(config, cand)
    monkeypatch.setattr(rough_memory, "post_validated", lambda *_: False)
    without = rough_memory.static_bytes(config, cand)
    layer = MODEL.layer_params()
    assert with_snapshot[1] - without[1] == pytest.approx(16 * 2 * layer, rel=0.01)


def test_a_snapshot_that_does_not_fit_falls_back_to_the_synchronous_step():
    """A budget between the two peaks: the post-validated ZB-H2 does not fit, the same
    schedule with a synchronous step does. The view's prediction (no recompute retry)
    keeps the synchronous one (flags without the post-validation flag); the plan's keeps
    the fastest that fits of those and the --recompute-lgd retries."""
    config, cand = _config(), _candidate("zb-h2")
    validated = search.predict(config, cand)
    synchronous = search.predict(config, Candidate(**{**vars(cand), "post_validation": False}))
    assert max(validated.peak_memory_gb) > max(synchronous.peak_memory_gb)
    budget = (max(validated.peak_memory_gb) + max(synchronous.peak_memory_gb)) / 2
    tight = dataclasses.replace(config, memory_gb=budget)
    view = search._predict_or_none(tight, cand)
    assert view.fits and not view.candidate.post_validation
    assert post_validation.FLAG not in view.flags
    assert view.step_s == pytest.approx(synchronous.step_s)
    best = search._predict_fitting(tight, cand)
    assert best.fits and best.tokens_per_s >= view.tokens_per_s
    assert (post_validation.FLAG in best.flags) == best.candidate.post_validation
    assert best.candidate.post_validation <= best.candidate.recompute  # PV fits only so
