"""benchmarks/results/ (issue 52, part 3): one current record per benchmark and card, each
cited by README.md or a docs page; superseded runs in one history/ file per benchmark;
INDEX.md (file, command, date, code, the claim it backs) is what
benchmarks/results_index.py writes; every results path README, docs, code and tests name
exists; the pooled runtime files are what their history files pool to."""

from __future__ import annotations

import json
import pathlib
import re

import pytest

from benchmarks import results_index
from benchmarks.results_history import is_history

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"

NOT_YET_MEASURED = frozenset({
    "tp_gpu.json",    # tools/gpu_check.py's bench-tp stage writes it on two GPUs; none ran yet
    "gpu_step.json",  # bench_gpu_step.py's default --out; records are committed per card
    "INDEX.md",       # results_index.py's own output, named in its docstring
})
"""Output paths of scripts that no committed record has (yet)."""


def test_index_is_current():
    text = (RESULTS / "INDEX.md").read_text(encoding="utf-8")
    assert text == results_index.index(), \
        "benchmarks/results/INDEX.md is stale: run python benchmarks/results_index.py"


def test_every_current_file_has_command_date_and_commit():
    for name in results_index.current_files():
        meta = results_index.provenance(name)
        assert meta["command"] and meta["date"][:4].isdigit() and meta["commit"], name


def test_every_current_file_backs_a_readme_or_docs_line():
    assert not results_index.uncited(), \
        "results files no README.md / docs line cites: cite them or move them to history/"


def test_every_cited_results_path_exists():
    missing = results_index.missing_paths(not_yet=NOT_YET_MEASURED)
    assert not missing, f"results paths named but absent: {missing}"


def test_results_holds_records_and_history_holds_runs():
    """No ``_runN`` / ``_seqN`` piles or log folders outside history/; each history file is
    a list of runs (or logs) with their former names and provenance."""
    for path in RESULTS.iterdir():
        assert path.is_file() or path.name == "history", f"folder {path.name} in results/"
        assert not re.search(r"_(run|seq)\d", path.name), f"{path.name}: a run of a pile"
    for name in results_index.history_files():
        doc = json.loads((RESULTS / name).read_text(encoding="utf-8"))
        assert doc["about"], name
        if "logs" in doc:
            assert doc["logs"] and all(isinstance(t, str) for t in doc["logs"].values())
            continue
        assert is_history(doc), name
        for run in doc["runs"]:
            assert run["file"] and run["date"] and run["commit"] and run["command"], run["file"]
            assert not (RESULTS / run["file"]).exists(), f"{run['file']} is current and history"


@pytest.mark.parametrize("name", ["runtime_cpu_vs_torch", "runtime_cpu_isolated"])
def test_pooled_files_are_their_history_pooled(name):
    from benchmarks.bench_runtime import pool

    stored = json.loads((RESULTS / f"{name}_pooled.json").read_text(encoding="utf-8"))
    assert pool([str(RESULTS / "history" / f"{name}.json")]) == stored


R = "benchmarks" + "/results/"  # split, so the path check of this repository skips these


def _tree(tmp_path: pathlib.Path) -> pathlib.Path:
    (tmp_path / "docs").mkdir()
    results = tmp_path / "benchmarks" / "results"
    results.mkdir(parents=True)
    (results / "a.json").write_text(json.dumps({"command": "x", "date": "2026-01-01",
                                                "commit": "abc"}))
    (results / "lane_3.txt").write_text("log\n")
    (results / "provenance.json").write_text(json.dumps(
        {"lane_3.txt": {"command": "make lane", "date": "2026-01-02", "commit": "def"}}))
    return tmp_path


def test_the_checks_catch_an_uncited_file_and_a_missing_path(tmp_path):
    root = _tree(tmp_path)
    (root / "README.md").write_text(f"# R\n\nall in {R}*.json\n")
    (root / "docs" / "p.md").write_text(f"# P\n\n## S\n\nsee `{R}a.json` and {R}gone.json\n")
    assert results_index.uncited(root) == ["lane_3.txt"]  # a bare *.json names nothing
    assert results_index.citations("a.json", root) == [("docs/p.md", "S", "s")]
    assert list(results_index.missing_paths(root)) == [f"{R}gone.json"]
    (root / "docs" / "q.md").write_text(f"# Q\n\nlogs in {R}lane_<n>.txt\n")
    assert results_index.uncited(root) == []
    assert "| [`lane_3.txt`](lane_3.txt) | `make lane` | 2026-01-02 | def |" in \
        results_index.index(root)


def test_a_file_without_provenance_is_named(tmp_path):
    root = _tree(tmp_path)
    (root / "benchmarks" / "results" / "b.json").write_text("{}")
    with pytest.raises(ValueError, match=r"results/b\.json: no command/date/commit"):
        results_index.provenance("b.json", root)
