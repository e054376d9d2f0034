"""bench_runtime_isolated.py: our ZB-V and PyTorch's ScheduleZBVZeroBubble, each in its
own pair of processes taking turns, train chunks built from the same seed to the same
gradients (no timing is asserted)."""

from __future__ import annotations

import importlib
import json

import pytest

isolated = importlib.import_module("benchmarks.bench_runtime_isolated")


@pytest.mark.multiproc
def test_each_runtime_in_its_own_processes_computes_the_same_gradients(tmp_path):
    out = tmp_path / "isolated.json"
    result = isolated.main(["--schedule", "zbv", "--seq", "32", "--hidden", "64",
                            "--repeats", "3", "--out", str(out)])
    assert json.loads(out.read_text())["summary"] == result["summary"]
    assert [row["schedule"] for row in result["rows"]] == ["zbv", "torch-ZBVZeroBubble"]
    assert all(len(row["step_times_s"]) == 3 for row in result["rows"])
    assert result["grad_sums_nonzero"] > 0
    assert result["grad_sum_max_rel_diff"] <= 1e-6
