"""tools/gpu_oneshot.py, the budgeted one-call GPU command: each phase gets at most
min(cap, time left), a phase whose minimum no longer fits or whose prerequisite failed is
skipped and recorded, the record is rewritten after every phase, the whole fits 420 s."""

from __future__ import annotations

import argparse
import importlib
import json

oneshot = importlib.import_module("tools.gpu_oneshot")


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _args(tmp_path, budget):
    return argparse.Namespace(out=str(tmp_path), logs=str(tmp_path / "logs"), budget_s=budget,
                              work=str(tmp_path / "work"), python="python3")


def _runner(clock, durations, exits, seen):
    def run(command, timeout_s, log_path, env):
        name = {"pip": "wheels", "setup.py": "build", "pytest": "pytest-gpu",
                "benchmarks/bench_cross_entropy.py": "cross-entropy",
                "benchmarks/bench_gpu_step.py": "step"}[
            next(w for w in command[1:] if w in ("pip", "setup.py", "pytest",
                                                   "benchmarks/bench_cross_entropy.py",
                                                   "benchmarks/bench_gpu_step.py"))]
        seen.append((name, timeout_s, env, command))
        clock.now += min(durations.get(name, 10), timeout_s)
        with open(log_path, "w") as handle:
            handle.write(f"{name} log\n")
        return exits.get(name, 0)
    return run


def test_the_default_call_fits_twice_in_15_minutes():
    assert oneshot.DEFAULT_BUDGET_S <= 420


def test_phases_share_the_budget_and_the_step_gets_what_is_left(tmp_path):
    clock, seen = _Clock(), []
    durations = {"wheels": 20, "build": 55, "pytest-gpu": 140, "cross-entropy": 30}
    record = oneshot.run_phases(_args(tmp_path, 400), runner=_runner(clock, durations, {}, seen),
                                clock=clock, say=lambda line: None)
    assert [entry[0] for entry in seen] == ["wheels", "build", "pytest-gpu", "cross-entropy",
                                            "step"]
    assert all(e["status"] == "passed" for e in record["phases"].values())
    step = seen[-1]
    assert step[1] == 400 - 245  # the rest of the budget
    assert step[3][step[3].index("--budget-s") + 1] == "145"
    assert seen[1][2]["ODC_PP_NO_CUDA"] == "0"  # the build requires the CUDA backend
    assert "-m" in seen[2][3] and "gpu" in seen[2][3]
    written = json.loads((tmp_path / "oneshot.json").read_text())
    assert written["phases"]["step"]["status"] == "passed" and written["elapsed_s"] <= 400


def test_a_spent_budget_and_a_failed_build_skip_phases(tmp_path):
    clock, seen = _Clock(), []
    record = oneshot.run_phases(
        _args(tmp_path, 400), runner=_runner(clock, {"wheels": 20}, {"build": 1}, seen),
        clock=clock, say=lambda line: None)
    assert record["phases"]["build"]["status"] == "failed"
    assert record["phases"]["pytest-gpu"] == {"status": "skipped", "why": "needs build"}
    assert record["phases"]["step"]["status"] == "skipped"
    assert record["phases"]["cross-entropy"]["status"] == "passed"  # needs only the wheels
    clock, seen = _Clock(), []
    record = oneshot.run_phases(
        _args(tmp_path, 200), runner=_runner(clock, {"pytest-gpu": 150}, {}, seen),
        clock=clock, say=lambda line: None)
    assert seen[2][1] == 150 and record["phases"]["step"]["status"] == "skipped"
    assert record["phases"]["step"]["why"].startswith("budget spent")
    assert seen[3][0] == "cross-entropy" and seen[3][1] == 30  # what was left, under its cap
    assert record["phases"]["step"]["why"] == "budget spent: 20 s left, needs 70"


def test_refused_without_a_gpu(tmp_path):
    """It installs into the interpreter and builds for the device: never on a CPU box."""
    import torch
    if torch.cuda.is_available():
        return
    assert oneshot.main(["--out", str(tmp_path)]) == 2
    assert not list(tmp_path.iterdir())
