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
MODELS = {"1.5B": 3, "6.2B": 4, "14.6B": 3, "28.3B": 2}
"""Table 3's models and their interleaved chunk count (one layer per chunk)."""


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


def test_vocabulary_reproduces_the_named_model_sizes():
    """The output layer's FLOPs use V = 32000 (not printed in the paper): with one tied
    embedding, 12 h^2 L + V h rounds to every name of Table 3; GPT-2's 50257 does not."""
    tables = bench._load("zb_paper_tables.json")

    def names(vocab: int) -> list[str]:
        return [f"{(12 * s['hidden_size'] ** 2 * tables['table3_layers'][m] + vocab * s['hidden_size']) / 1e9:.1f}B"
                for m, s in tables["table3_shapes"].items()]

    assert tables["vocab_size"] == 32000
    assert names(32000) == list(MODELS)
    assert names(50257) != list(MODELS)


def test_uneven_stages_execution_costs():
    """Stage 0 runs one layer fewer; the last stage one layer fewer plus the output layer
    (its F/B/W scaled by 2V / (24h + 4s), 2V / (24h + 8s), 2V / 24h); the middle stages
    run Table 9's costs. Interleaved (one layer per chunk): the first chunk is empty."""
    tables = bench._load("zb_paper_tables.json")
    row = tables["table5"][3]  # 6.2B, 4 layers on a middle stage
    planned = bench._costs(row)
    costs = bench.execution_costs(row, tables, planned, 1)
    assert costs.t_f[1:-1] == [row["t_f"]] * 6
    assert costs.t_f[0] == pytest.approx(row["t_f"] * 3 / 4)
    h, s, v = 4096, 1024, 32000
    assert costs.t_w[-1] == pytest.approx(row["t_w"] / 4 * (3 + 2 * v / (24 * h)))
    assert costs.t_b[-1] == pytest.approx(row["t_b"] / 4 * (3 + 2 * v / (24 * h + 8 * s)))
    chunked = bench.execution_costs(row, tables, bench._costs(row, 4), 4)
    assert chunked.t_f[0] == pytest.approx(0.0)
    assert chunked.t_f[1] == pytest.approx(row["t_f"] / 4)


@pytest.mark.slow
def test_table4_errors(section):
    """All 12 rows of Table 4 (pp 8, 16, 32). Interleaved, ZB-1p and ZB-2p within 2% on
    average (issue 48; the parent's model over these rows: 1.69%, 1.04%, 1.82% with ZB-2p
    +1.29% signed, from equal stages), ZB-2p neither biased low nor high by more than 1%
    (its single-iteration makespan is 5% low: the steady period matters), and the
    static memory solved from the baselines' peaks is positive on every model (the
    parent's equal-stage units gave -4.3 GB and -2.1 GB at 1.5B and 6.2B)."""
    summary = section["summary"]
    assert len(section["rows"]) == 12
    assert {row["pp"] for row in section["rows"]} == {8, 16, 32}
    for name in ("1f1b-interleaved", "zb-1p", "zb-2p"):
        assert summary[name]["ours_mean_abs_error_pct"] <= 2.0, (name, summary[name])
    assert summary["zb-2p"]["ours_mean_abs_error_pct"] < 1.82
    assert abs(summary["zb-2p"]["ours_mean_error_pct"]) < 1.0
    assert summary["zb-2p"]["makespan_mean_error_pct"] < -3.0
    for row in section["rows"]:
        assert row["interleaved_chunks"] == MODELS[row["model"]]
    for model, memory in section["memory"].items():
        assert memory["static_gb"] > 0, (model, memory)
        for name, paper in memory["paper_gb"].items():
            assert abs(memory["predicted_gb"][name] - paper) <= 0.1 * paper, (model, name)


@pytest.mark.slow
def test_stored_results_are_this_model(section):
    """benchmarks/results/planner_validation.json holds what the bench computes now
    (rerun: bench_planner_validation.py --update benchmarks/results/planner_validation.json)."""
    with open(RESULTS, encoding="utf-8") as handle:
        stored = json.load(handle)["zb_paper"]
    assert stored["summary"] == section["summary"]
    assert [r["error_pct"] for r in stored["rows"]] == [r["error_pct"] for r in section["rows"]]
    assert stored["memory"] == section["memory"]
