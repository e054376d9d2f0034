"""The timing helpers every benchmark shares, the LB-Mini sweep's verdict, and the
planner measurement's data-parallel step (pure functions: no timing here)."""

from __future__ import annotations

import importlib
import json

import pytest

from odc_pp.testing.bench import emit, rotated, spread

sweep = importlib.import_module("benchmarks.bench_lb_mini")
measure = importlib.import_module("benchmarks.planner_measure")


def test_spread_is_median_min_max_of_the_rounds():
    assert spread([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0,
                                       "rounds": [3.0, 1.0, 2.0]}


def test_rotated_order_puts_each_item_first_once():
    items = ["a", "b", "c"]
    firsts = [rotated(items, r)[0] for r in range(3)]
    assert sorted(firsts) == items
    assert all(sorted(rotated(items, r)) == items for r in range(5))


def test_emit_writes_the_document_and_creates_folders(tmp_path):
    out = tmp_path / "deep" / "result.json"
    emit({"x": 1}, out=str(out), as_json=False)
    assert json.loads(out.read_text()) == {"x": 1}


def _runs(times: dict[str, list[float]]) -> dict:
    return {config: [{"step_s": t, "idle_s": [0.0, 0.1], "busy_s": [t, t - 0.1],
                      "microbatches_per_replica": [[1, 1]], "load_1min": 0.5}
                     for t in values] for config, values in times.items()}


def test_sweep_ratios_are_baseline_over_config_per_round():
    runs = {("packed", 2): _runs({"collective+balanced": [2.0, 2.2, 1.8],
                                  "odc+balanced": [2.0, 2.0, 2.0],
                                  "odc+lb-mini": [1.6, 2.0, 1.5]})}
    (point,) = sweep.summarize(runs)
    ratio = point["configs"]["odc+lb-mini"]["speedup_vs_baseline"]
    assert ratio["rounds"] == [1.25, 1.1, 1.2]
    assert (ratio["median"], ratio["min"], ratio["max"]) == (1.2, 1.1, 1.25)


def test_sweep_verdict_checks_the_three_conditions():
    runs = {("padded", 2): _runs({"collective+balanced": [1.0] * 3,
                                  "odc+balanced": [0.9] * 3, "odc+lb-mini": [0.8] * 3}),
            ("padded", 4): _runs({"collective+balanced": [1.0] * 3,
                                  "odc+balanced": [0.9] * 3, "odc+lb-mini": [1.05] * 3})}
    verdict = sweep.verdict(sweep.summarize(runs))["padded"]
    assert verdict["peak_speedup"] == 1.25 and verdict["peak_at_samples_per_replica"] == 2
    assert verdict["peak_at_least_1.2"]
    assert not verdict["never_below_1.0"]          # 1/1.05 < 1
    assert not verdict["never_below_odc_balanced"]  # 0.952 < 1.111


def test_sweep_gives_a_ratio_against_each_baseline_fsdp_style_and_megatron_ddp():
    """Issue 49: ODC + LB-Mini against collective + balanced and against ddp + none /
    ddp + balanced, from the same rounds; a run without odc+balanced has no verdict."""
    runs = {("packed", 4): _runs({"collective+balanced": [2.0, 2.0, 2.0],
                                  "ddp+none": [1.8, 2.4, 2.0],
                                  "ddp+balanced": [1.6, 1.6, 1.7],
                                  "odc+lb-mini": [1.6, 2.0, 1.7]})}
    (point,) = sweep.summarize(runs)
    vs = point["configs"]["odc+lb-mini"]["speedup_vs"]
    assert set(vs) == {"collective+balanced", "ddp+none", "ddp+balanced"}
    assert vs["ddp+none"]["rounds"] == [1.125, 1.2, 1.176]
    assert vs["ddp+balanced"]["median"] == 1.0 and vs["ddp+balanced"]["min"] == 0.8
    assert point["configs"]["odc+lb-mini"]["speedup_vs_baseline"] == vs["collective+balanced"]
    assert "ddp+none" not in point["configs"]["ddp+none"]["speedup_vs"]
    assert sweep.CONFIGS["ddp+balanced"] == ["--dp-mode", "ddp", "--load-balance", "balanced"]
    assert sweep.verdict([point]) == {}


def test_padded_lb_mini_runs_unpacked_and_every_config_shares_the_path_flags():
    assert "--no-pack-sequences" in sweep.config_flags("padded", "odc+lb-mini")
    for config in sweep.CONFIGS:
        assert sweep.config_flags("packed", config)[:3] == sweep.PATHS["packed"]


@pytest.mark.parametrize("in_flight, expected", [(None, 5.0), (1, 5.0), (8, 5.0)])
def test_data_parallel_step_odc_waits_once_collectives_every_microbatch(in_flight, expected):
    costs = [[3.0, 1.0, 1.0], [1.0, 2.0]]  # replica 0 has 3 microbatches, replica 1 two
    assert measure._data_parallel_step(costs, in_flight=in_flight) == expected


def test_collective_replicas_run_at_most_in_flight_microbatches_apart():
    """A replica waits for its (j - in_flight)-th reduce-scatter after issuing its j-th,
    so with one in flight a fast replica idles for the slow one's previous microbatch."""
    costs = [[1.0, 1.0, 1.0, 1.0], [3.0, 3.0, 1.0, 1.0]]
    # in flight 1: replica 0 is released at j=1 by replica 1's j=0 (3), then 6, 7; replica 1
    # finishes 3, 6, 7, 8
    assert measure._data_parallel_step(costs, in_flight=1) == 8.0
    assert measure._data_parallel_step(costs, in_flight=None) == 8.0  # ODC: max of sums
    uneven = [[1.0, 1.0, 1.0], [3.0, 0.5, 0.5]]
    assert measure._data_parallel_step(uneven, in_flight=None) == 4.0
    assert measure._data_parallel_step(uneven, in_flight=1) == 4.0
    crossed = [[3.0, 0.1, 0.1], [0.1, 0.1, 3.0]]  # the slow microbatches two apart
    assert measure._data_parallel_step(crossed, in_flight=1) == pytest.approx(6.0)
    assert measure._data_parallel_step(crossed, in_flight=2) == pytest.approx(3.2)
    assert measure._data_parallel_step(crossed, in_flight=None) == pytest.approx(3.2)


def test_prediction_adds_each_ranks_share_of_the_optimizer_step():
    """planner_measure.predict: a rank steps the optimizer over 1/(pp x dp) of the model
    after its minibatch (issue 31's optimizer term); without the calibrated time nothing
    is added."""
    calibration = {"a": 4e-7, "b": 2e-4, "c": 0.01,
                   "shares": {"F": 0.33, "B": 0.5, "W": 0.17}}
    for name in ("pp2-1f1b/seq512", "dp2-odc-balanced/seq1024"):
        flags = measure._configs()[name]
        base = measure.predict(flags, calibration, range(1, 3))
        stepped = measure.predict(flags, {**calibration, "optimizer_s": 0.08}, range(1, 3))
        assert [s - b for s, b in zip(stepped, base)] == pytest.approx([0.04, 0.04])


def test_spearman_and_ranking_per_length_distribution():
    assert measure.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert measure.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert measure.spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9487, abs=1e-4)
    rows = [{"config": "a/seq512", "predicted_s": 1.0, "measured_mean_s": 1.1},
            {"config": "b/seq512", "predicted_s": 2.0, "measured_mean_s": 1.0},
            {"config": "c/seq1024", "predicted_s": 1.0, "measured_mean_s": 1.0}]
    out = measure.ranking(rows)
    assert set(out) == {"seq512"}  # one configuration alone ranks nothing
    assert out["seq512"]["spearman"] == pytest.approx(-1.0)
    assert out["seq512"]["predicted_best"] == "a/seq512"
    assert out["seq512"]["predicted_best_over_measured_best"] == pytest.approx(1.1)
