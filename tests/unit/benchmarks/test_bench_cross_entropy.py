"""bench_cross_entropy.py at a tiny shape on the CPU: ours as it is and as it was give the
same loss and gradients, the libraries are recorded as skipped, the JSON is written."""

from __future__ import annotations

import importlib
import json

import torch

step = importlib.import_module("benchmarks.bench_cross_entropy")


def test_tiny_run_compares_ours_with_ours_previous(tmp_path):
    out = tmp_path / "ce.json"
    assert step.main(["--tiny", "--iters", "2", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert set(rows) == {"ours-previous", "ours", "liger-kernel", "cut-cross-entropy"}
    assert "skipped" in rows["liger-kernel"] and "skipped" in rows["cut-cross-entropy"]
    assert rows["ours"]["grad_input_vs_previous"] < 1e-5
    assert rows["ours"]["grad_weight_vs_previous"] < 1e-5
    assert abs(rows["ours"]["loss_minus_previous"]) < 1e-5
    assert result["fastest"] in ("ours", "ours-previous")


def test_the_real_shape_is_llama3_8bs_output_layer():
    assert step.REAL == {"tokens": 8192, "hidden": 4096, "vocab": 128256}
    if not torch.cuda.is_available():  # the real shape is refused on a CPU, not run
        assert step.main([]) == 2
