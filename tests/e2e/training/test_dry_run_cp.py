"""The memory dry run with --context-parallel-size (issue 32): a CP rank is reported as a
cp = 1 rank holding 1/cp of every row's tokens, with its replica's microbatch count and
its state sharded over dp x cp ranks. A child process (the dry run sets up a fake process
group), a tiny model: a few seconds."""

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
        "--pipeline-schedule", "1f1b", "--mock-data", "--vocab-size", "256",
        "--micro-batch-size", "1", "--global-batch-size", "8",
        "--context-parallel-size", "2"]


def test_cp_rank_holds_its_share_of_the_tokens(tmp_path):
    path = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "pretrain_gpt.py", *TINY, "--dry-run",
                           "--dry-run-world-size", "4", "--dry-run-rank", "0",
                           "--memory-gb", "80", "--dry-run-json", str(path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "rank 0: peak" in done.stdout
    report = next(iter(json.loads(path.read_text()).values()))
    measured = report["measured"]
    # world 4 = pp 2 x cp 2 x dp 1: the replica's 8 microbatches, each rank's message
    # holds 64 / 2 tokens x hidden 64 x fp32
    assert measured["num_microbatches"] == 8
    assert measured["message_bytes"] == 32 * 64 * 4
    # the state is sharded over dp x cp = 2 ranks: half of the gathered parameters
    categories = report["categories"]
    assert abs(categories["params_sharded"] * 2 - categories["params_gathered"]) <= 64


def test_a_cp_rank_is_reported_at_its_own_pipeline_stage():
    """--dry-run-rank names a rank of the cp layout (tp fastest, then cp, pp, dp); the
    cp = 1 job it is modelled as has the same tp and pipeline rank (before the fix the
    last stage's ranks of cp 4 x pp 2 were reported as the first stage)."""
    from odc_pp.training.arguments import parse_args
    from odc_pp.layout import layout_rank
    from odc_pp.training.dry_run import _cp1_rank

    parallel = parse_args(TINY[:-2] + ["--context-parallel-size", "4"]).resolve(16).layout
    for rank in range(16):  # pp 2 x cp 4 x dp 2
        cp_rank, pp_rank, dp_rank = rank % 4, rank // 4 % 2, rank // 8
        assert _cp1_rank(rank, parallel) == layout_rank(
            dp_rank=dp_rank * 4 + cp_rank, pp_rank=pp_rank, tp_rank=0, pp=2, tp=1)
        assert _cp1_rank(rank, parallel) % 2 == pp_rank
