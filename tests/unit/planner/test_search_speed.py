"""What the search's shortcuts rely on (issue 31, Deliver 4): they change its time, never
its answer."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from odc_pp.planner.hardware import PRESETS
from odc_pp.planner.inputs import ModelSpec
from odc_pp.planner.search import PlanConfig, _simulated, candidates, plan, predict


def _config(**overrides) -> PlanConfig:
    model = ModelSpec(num_layers=16, hidden_size=2048, num_attention_heads=16,
                      ffn_hidden_size=5632, vocab_size=32000, seq_length=8192,
                      gated_mlp=True, num_query_groups=4)
    lengths = np.clip(np.random.default_rng(0).lognormal(np.log(1500), 1.0, 400), 16,
                      8192).astype(int)
    return PlanConfig(**dict(dict(model=model, cluster=PRESETS["h100"], gpus=4,
                                  global_batch=32, lengths=lengths, memory_gb=20.0,
                                  tp_sizes=(1,), samples=1), **overrides))


def test_a_recompute_retry_is_never_faster_and_peaks_like_the_original():
    """_may_fit skips simulating a retry that cannot fit: recompute only lengthens B, so
    the retry's step is never shorter, and its activation peak (microbatch units) is the
    original's (a rank's in-order running sum, whatever the durations)."""
    config = _config()
    checked = 0
    for cand in candidates(config):
        if cand.schedule == "offload":
            continue
        again = replace(cand, recompute=True)
        try:
            base, retry = predict(config, cand), predict(config, again)
        except ValueError:
            continue
        link = 0.0  # cached: the argument is not read again
        units = _simulated(config, cand, link)[1]
        assert np.array_equal(units, _simulated(config, again, link)[1]), cand
        assert retry.step_s >= base.step_s, cand
        checked += 1
    assert checked > 10


@pytest.mark.parametrize("memory_gb", [20.0])
def test_the_memo_does_not_change_the_plan(memory_gb):
    """A search on a fresh config and one whose memo is already full (another memory
    budget ran first) rank the same candidates the same way with the same numbers."""
    warm = _config(memory_gb=80.0)
    plan(warm)
    fresh, _ = plan(_config(memory_gb=memory_gb))
    again, _ = plan(replace(warm, memory_gb=memory_gb))
    assert [p.to_dict() for p in fresh] == [p.to_dict() for p in again]


def test_a_copy_with_another_model_does_not_reuse_the_memo():
    """replace() shares the memo; a copy that changes a timing input predicts afresh."""
    small = _config()
    cand = next(c for c in candidates(small) if c.pp == 2)
    predict(small, cand)
    bigger = replace(small, model=replace(small.model, num_layers=32))
    assert predict(bigger, cand).step_s == predict(_config(model=bigger.model), cand).step_s
    assert predict(bigger, cand).step_s > predict(_config(), cand).step_s


def test_two_processes_plan_what_one_plans():
    """--jobs spreads the layouts over processes; the ranked predictions are the same."""
    one, default_one = plan(_config(gpus=8, tp_sizes=(1, 2)))
    two, default_two = plan(_config(gpus=8, tp_sizes=(1, 2), workers=2))
    assert [p.to_dict() for p in one] == [p.to_dict() for p in two]
    assert default_one.to_dict() == default_two.to_dict()
