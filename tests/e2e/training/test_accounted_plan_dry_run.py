"""The plan's row of PipeOffload's 10.5B layout -- 38 layers over 8 pipeline ranks x 5
chunks, one layer off the first and the last virtual stage, printed as Megatron-LM's
--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split -- runs
under ``pretrain_gpt.py --dry-run`` exactly as printed, on the first rank (its first
chunk the embedding alone) and the last (its last chunk the loss alone). Before, the
plan had no such row and the flags were unknown."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.unit.planner.test_accounted_split_plan import config, five_chunk_row

from odc_pp.planner.search import plan

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))


@pytest.mark.parametrize("rank", [0, 7])
def test_the_38_layer_five_chunk_rows_printed_flags_dry_run(rank):
    ranked, _ = plan(config(schedules=("interleaved",)))
    flags = five_chunk_row(ranked).flags
    assert "--account-for-embedding-in-pipeline-split" in flags
    run = subprocess.run([sys.executable, "pretrain_gpt.py", *flags, "--mock-data",
                          "--dry-run", "--dry-run-world-size", "8", "--dry-run-rank",
                          str(rank), "--memory-gb", "80"],
                         cwd=ROOT, capture_output=True, text=True, timeout=900,
                         env=dict(os.environ, PYTHONPATH=ROOT))
    assert run.returncode == 0, run.stderr[-3000:]  # a tiny model: it fits
    assert f"rank {rank}: peak" in run.stdout and "-> fits" in run.stdout, run.stdout[-2000:]
