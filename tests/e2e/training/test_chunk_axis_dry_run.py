"""The plan's flags of a candidate priced at 5 model chunks (issue 48, Deliver 4) run under
``pretrain_gpt.py --dry-run`` exactly as the plan prints them: 70 layers over 8 pipeline
ranks x 5 chunks, with Megatron's lighter first and last stages (5 + 6 x 10 + 5 layers).
Before, the plan priced interleaved at 2 chunks only and had no such row."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.unit.planner.test_chunk_axis import _config

from odc_pp.planner.search import plan

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))


def test_a_five_chunk_rows_printed_flags_dry_run():
    ranked, _ = plan(_config(schedules=("interleaved",)))
    row = next(p for p in ranked if p.candidate.pp == 8 and p.candidate.num_chunks == 5)
    flags = row.flags
    assert flags[flags.index("--num-model-chunks") + 1] == "5"
    run = subprocess.run([sys.executable, "pretrain_gpt.py", *flags, "--mock-data",
                          "--dry-run", "--dry-run-world-size", "8", "--memory-gb", "80"],
                         cwd=ROOT, capture_output=True, text=True, timeout=900,
                         env=dict(os.environ, PYTHONPATH=ROOT))
    assert run.returncode == 0, run.stderr[-3000:]  # a tiny model: it fits
    assert "-> fits" in run.stdout, run.stdout[-2000:]
