"""Issue 50's verdicts on the one-GPU step (benchmarks/gpu_step_verdicts.py): each target
met, not met or unmeasured from a record's rows, and the committed H200 record's block is
what its own numbers give."""

from __future__ import annotations

import importlib
import json
import os

import pytest

verdicts_module = importlib.import_module("benchmarks.gpu_step_verdicts")
verdicts = verdicts_module.verdicts
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))

DRY = {"predicted_peak_gb": 44.0,
       "categories_gb": {"params_sharded": 4.0, "grad_accumulators": 8.0,
                         "optimizer_state": 23.0, "activations": 8.0, "transient": 1.0}}


def _rows(**over):
    rows = {"full-1f1b": {"exit": 0, "tokens_per_s": 60.0, "mfu": 0.61, "step_s": 1.0,
                          "first_over_steady": 1.5, "peak_allocated_gb": 42.0,
                          "dry_run": DRY},
            "hf": {"exit": 0, "tokens_per_s": 50.0},
            "lbmini-packed": {"exit": 0, "tokens_per_s": 55.0, "mfu": 0.59,
                              "first_over_steady": 1.9},
            "unpacked": {"exit": 0, "tokens_per_s": 50.0, "first_over_steady": 1.2},
            "full-1f1b-layer": {"exit": 0, "step_s": 1.05}}
    rows.update(over)
    return rows


def test_every_target_met():
    got = verdicts(_rows())
    assert {key: v["status"] for key, v in got.items()} == \
        {key: "met" for key in verdicts_module.TARGETS}
    assert got["full_vs_hf"]["value"] == pytest.approx(1.2)
    assert got["packed_within_points_of_full"]["value"] == pytest.approx(0.02)
    assert got["dry_run_over_measured"]["value"] == pytest.approx(44 / 42)
    # 42 - (4 + 8 + 23) = 7 GB beside the model states, against 8 GB saved activations
    assert got["activations_over_saved"]["value"] == pytest.approx(7 / 8)
    assert got["layer_vs_minibatch"]["value"] == pytest.approx(1.05)


def test_each_distance_is_not_met():
    under = dict(DRY, predicted_peak_gb=40.0)  # the dry run under the measured peak
    got = verdicts(_rows(**{
        "full-1f1b": {"exit": 0, "tokens_per_s": 52.0, "mfu": 0.56, "step_s": 1.0,
                      "first_over_steady": 2.97, "peak_allocated_gb": 45.0, "dry_run": under},
        "full-1f1b-layer": {"exit": 0, "step_s": 1.2}}))
    status = {key: v["status"] for key, v in got.items()}
    assert status["full_mfu"] == status["full_vs_hf"] == "not met"
    assert status["first_over_steady"] == "not met"
    assert got["first_over_steady"]["rows"] == ["full-1f1b"]
    assert status["dry_run_over_measured"] == "not met"       # 40/45 < 1
    assert status["activations_over_saved"] == "not met"      # (45-35)/8 = 1.25
    assert status["layer_vs_minibatch"] == "not met"
    assert status["packed_mfu"] == "met"


def test_missing_or_failed_rows_are_unmeasured():
    got = verdicts({"full-1f1b": {"exit": 1, "mfu": 0.7}, "hf": {"tokens_per_s": 1.0}})
    assert all(v["status"] == "unmeasured" and v["value"] is None for v in got.values())
    assert verdicts_module.summary(got) == "0/9 targets met, 0 not met, 9 unmeasured"


def test_the_h200_record_holds_the_verdicts_of_its_own_numbers():
    with open(os.path.join(ROOT, "benchmarks", "results", "gpu_step_h200.json")) as handle:
        record = json.load(handle)
    assert record["verdicts"] == json.loads(json.dumps(verdicts(record["runs"])))
    assert record["verdicts"]["full_mfu"]["status"] == "not met"  # 56.2% against 60%
