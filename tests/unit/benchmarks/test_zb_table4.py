"""The zero-bubble paper's Table 4 recomputed from the data files (issue 48; no timing):
the simulator, given the paper's Table 9 costs and the runs modelled as the authors ran
them (bench_planner_validation.py's method), predicts every schedule's throughput from
1F1B's; the errors and the stored planner_validation.json agree with a fresh run."""

from __future__ import annotations

import importlib
import json
import os

import pytest

from odc_pp.schedule.generators import generate
from odc_pp.schedule.simulator import simulate

bench = importlib.import_module("benchmarks.bench_planner_validation")
RESULTS = os.path.join(bench.ROOT, "benchmarks", "results", "planner_validation.json")


@pytest.fixture(scope="module")
def section() -> dict:
    return bench.zb_paper_section()


def test_interleaved_chunk_count_is_the_one_behind_table5():
    """One layer per virtual stage (ceil(layers / pp) chunks: 3 for 1.5B, 4 for 6.2B)
    reproduces Table 5's 1f1b-interleaved bubbles within 0.4 points on the Table 4 rows;
    2 chunks (the old assumption) is 1.4-5 points off."""
    tables = bench._load("zb_paper_tables.json")
    column = tables["table5_other_columns"]["1f1b-interleaved"]
    assert {bench.interleaved_chunks(tables, r) for r in tables["table5"]
            if r["pp"] == 8 and r["model"] == "1.5B"} == {3}
    for i, row in enumerate(tables["table5"]):
        if row["pp"] != 8:
            continue
        gaps = {}
        for v in (2, bench.interleaved_chunks(tables, row)):
            costs = bench._costs(row, v)
            schedule = generate("interleaved", pp=8, num_microbatches=row["microbatches"],
                                costs=costs, num_chunks=v)
            gaps[v] = abs(simulate(schedule, costs).bubble_rate - column[i])
        assert gaps[bench.interleaved_chunks(tables, row)] < 0.004, (row["model"], gaps)
        assert gaps[2] > 0.01, (row["model"], gaps)


def test_table4_errors(section):
    """Interleaved and ZB-1p within 2% on average over every Table 4 row (the parent's
    model: 2.46% and 1.97%); ZB-2p is no longer predicted low (its steady period: signed
    mean > 0, where the single-iteration makespan is 4% low) and is below the parent's
    2.83% mean (issue 48 asks for 2%: not reached, see the bench's docstring)."""
    summary = section["summary"]
    assert len(section["rows"]) == 6
    assert summary["1f1b-interleaved"]["ours_mean_abs_error_pct"] <= 2.0
    assert summary["zb-1p"]["ours_mean_abs_error_pct"] <= 2.0
    assert summary["zb-2p"]["ours_mean_error_pct"] > 0.0
    assert summary["zb-2p"]["makespan_mean_error_pct"] < 0.0
    assert summary["zb-2p"]["ours_mean_abs_error_pct"] < 2.83
    for row in section["rows"]:
        assert row["interleaved_chunks"] == {"1.5B": 3, "6.2B": 4}[row["model"]]


def test_stored_results_are_this_model(section):
    """benchmarks/results/planner_validation.json holds what the bench computes now
    (rerun: bench_planner_validation.py --update benchmarks/results/planner_validation.json)."""
    with open(RESULTS, encoding="utf-8") as handle:
        stored = json.load(handle)["zb_paper"]
    assert stored["summary"] == section["summary"]
    assert [r["error_pct"] for r in stored["rows"]] == [r["error_pct"] for r in section["rows"]]
