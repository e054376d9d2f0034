"""What the memory dry run prints (issue 33, Deliver 7): one table for this job and the
effect of its advice -- no tables that compare internal code versions -- and
``--dry-run-json`` with one report key (:data:`odc_pp.training.dry_run.REPORT_KEY`).

Each dry run sets up its own fake process group, so it runs in a child process (a tiny
model: a few seconds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
TINY = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
        "--ffn-hidden-size", "256", "--seq-length", "64", "--max-position-embeddings", "64",
        "--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
        "--disable-bias-linear", "--pipeline-model-parallel-size", "2",
        "--pipeline-schedule", "1f1b", "--enable-optimizer-post-validation", "--mock-data",
        "--vocab-size", "256", "--micro-batch-size", "1", "--global-batch-size", "8"]


def _dry_run(tmp_path, memory_gb: str):
    path = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "pretrain_gpt.py", *TINY, "--dry-run",
                           "--dry-run-world-size", "2", "--dry-run-rank", "0",
                           "--memory-gb", memory_gb, "--dry-run-json", str(path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    return done, json.loads(path.read_text()) if path.exists() else None


def test_one_table_for_this_job_and_the_advice_effect(tmp_path):
    # a budget below the tiny job's state: it does not fit, so advice is printed
    done, data = _dry_run(tmp_path, "0.0001")
    assert done.returncode == 1, done.stderr
    out = done.stdout
    assert "(before)" not in out and "(after)" not in out, out
    assert out.count("peak ") == 1 and out.count("params_gathered") == 1, out + done.stderr
    assert out.startswith("rank 0: peak "), out
    assert "DOES NOT FIT" in out.splitlines()[0]
    assert "advice: drop --enable-optimizer-post-validation" in out
    effect = [line for line in out.splitlines() if "effect of the advice" in line]
    assert len(effect) == 1, out
    assert list(data) == ["job"]
    report = data["job"]
    assert report["advised_total_gb"] < report["total_gb"]
    assert f"{report['total_gb']:.2f} GB -> {report['advised_total_gb']:.2f} GB" in effect[0]


def test_a_job_that_fits_prints_no_advice(tmp_path):
    done, data = _dry_run(tmp_path, "80")
    assert done.returncode == 0, done.stderr
    assert "-> fits" in done.stdout.splitlines()[0]
    assert "advice" not in done.stdout
    assert data["job"]["fits"] is True
