"""bench_gpu_step.py's pure parts: every run's flags parse through pretrain_gpt.py's own
parser (the GPU call cannot fail on a renamed flag), the steady-step summary of log
records, and the issue-29 verdicts (no timing here)."""

from __future__ import annotations

import importlib

import pytest

from odc_pp.training.arguments import parse_args

step = importlib.import_module("benchmarks.bench_gpu_step")


@pytest.mark.parametrize("name", ["full-1f1b", "full-zbv", "lbmini-packed", "unpacked"])
def test_every_run_parses_as_the_8b_layer_shape(name, tmp_path):
    rows = str(tmp_path / "rows.jsonl")
    flags = step.model_flags(step.SHAPE) + step.runs(step.SHAPE, rows, bf16=True)[name]
    args = parse_args(flags + ["--train-iters", "6"])
    assert (args.model.hidden_size, args.model.ffn_hidden_size, args.model.num_query_groups,
            args.model.vocab_size, args.model.seq_length) == (4096, 14336, 8, 128256, 8192)
    assert args.model.swiglu and args.model.bf16


def test_steady_step_is_the_median_after_the_first_two_iterations():
    records = [{"step_s": s, "tokens_per_s": 8192 * 8 / s, "tflops_per_device": 500 / s,
                "peak_memory_mb": 1024.0, "peak_allocated_mb": 512.0, "loss": 12.0}
               for s in (4.0, 1.5, 1.0, 1.2, 1.1)]
    summary = step.summarize(records, peak_tflops=1000.0)
    assert summary["step_s"] == 1.1 and summary["step_s_range"] == [1.0, 1.2]
    assert summary["first_over_steady"] == pytest.approx(4.0 / 1.1)
    assert summary["mfu"] == pytest.approx(500 / 1.1 / 1000)
    assert summary["peak_allocated_gb"] == 0.5


def test_the_record_carries_issue_50s_verdicts():
    rows = {"full-1f1b": {"tokens_per_s": 50.0, "mfu": 0.5, "first_over_steady": 2.5},
            "hf": {"tokens_per_s": 40.0}}
    got = step.verdicts(rows)
    assert set(got) == set(step.TARGETS)
    assert got["full_vs_hf"]["status"] == "met" and got["full_vs_hf"]["value"] == 1.25
    assert got["unpacked_vs_packed_per_token"]["status"] == "unmeasured"
