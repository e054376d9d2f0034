"""One verdict on memory between ``odc-pp plan`` and the dry run (issue 48): the plan
prints, for each row it gives flags for, its fullest pipeline rank and the
``pretrain_gpt.py --dry-run`` command of that rank; the command runs as printed (exit 0:
fits, 1: does not fit; never 2, bad flags) and gives the plan's verdict, with the same
budget (``odc_pp.planner.hardware.memory_budget_gb``: 90% of the H100's 80 GB).

Before, the plan judged 90% of HBM and the dry run 80 GB, so a job near the budget got
opposite verdicts (74.9 GB: "NO" from the plan, "fits" from the dry run), and the printed
flags failed under --dry-run ("give exactly one of --mock-data and --data-path")."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from odc_pp.plan_command import main as plan_main
from odc_pp.planner.report import DRY_RUN_PREFIX

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
TINY = ["--model-flags", "--num-layers 4 --hidden-size 32 --num-attention-heads 4 "
        "--seq-length 48 --vocab-size 48", "--gpus", "2", "--lengths-histogram",
        "16:60,32:30,48:10", "--global-batch", "8", "--top", "2"]
# two Llama-3-8B layers (with its embedding and output layer) at 112640 tokens per
# microbatch on one H100: predicted 74.9 GB, within the H100's 80 GB but over its 72 GB
# budget; two dry runs of a 2-layer model (about 15 s each on 2 cores)
NEAR_BUDGET = ["--model-flags",
               "--num-layers 2 --hidden-size 4096 --num-attention-heads 32 "
               "--group-query-attention --num-query-groups 8 --ffn-hidden-size 14336 --swiglu "
               "--normalization RMSNorm --position-embedding-type rope --vocab-size 128256 "
               "--disable-bias-linear --untie-embeddings-and-output-weights "
               "--seq-length 112640 --max-position-embeddings 112640",
               "--gpus", "1", "--cluster", "h100", "--lengths-histogram", "112640:100",
               "--global-batch", "2", "--tp-sizes", "1", "--schedules", "1f1b",
               "--token-caps", "1", "--dp-modes", "odc", "--samples", "1", "--top", "1"]


def _planned(argv: list[str], capsys) -> list[tuple[str, bool, float, list[str]]]:
    """(row label, the plan's verdict, its predicted peak GB, the printed dry-run argv)
    of every row the plan printed flags for."""
    assert plan_main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    flag_lines = [line for line in lines if line.startswith("flags of ")]
    rows = []
    for index, line in enumerate(lines):
        if not line.startswith("  fullest pipeline rank of "):
            continue
        label = line.split("fullest pipeline rank of ")[1].split(":")[0]
        fits = line.rstrip().split("-> ")[1].startswith("fits")
        peak = float(line.split("predicted peak ")[1].split(" GB")[0])
        command = lines[index + 1]
        assert command.startswith(DRY_RUN_PREFIX), command
        rows.append((label, fits, peak, command[len(DRY_RUN_PREFIX):].split()))
    assert flag_lines and len(rows) == len(flag_lines), lines
    return rows


def _dry_run(argv: list[str]) -> subprocess.CompletedProcess:
    assert argv[0] == "pretrain_gpt.py" and "--dry-run" in argv
    return subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=ROOT), timeout=900)


def test_every_printed_dry_run_command_runs_as_printed(capsys):
    """Row #1 (ODC) and the Megatron default (collective: its memory is ODC's, as the
    plan predicts it) of a tiny model on 2 GPUs."""
    rows = _planned(TINY, capsys)
    assert {label for label, *_ in rows} >= {"#1", "M"}
    for label, fits, _, argv in rows:
        run = _dry_run(argv)
        assert run.returncode in (0, 1), (label, run.stderr[-2000:])
        assert run.returncode == (0 if fits else 1), (label, run.stdout[-2000:])


@pytest.mark.slow
def test_plan_and_dry_run_agree_near_the_budget(capsys):
    """A job between the budget (72 GB) and the HBM (80 GB): the plan says it does not
    fit, and so does the dry run of the printed command -- also with the dry run's default
    budget (no --dry-run-gpu / --memory-gb: the H100's, as the plan's default --cluster)."""
    rows = _planned(NEAR_BUDGET, capsys)
    for label, fits, peak, argv in rows:
        assert 72 < peak < 80, (label, peak)  # near the budget: the old limits disagreed
        at = argv.index("--dry-run-gpu")
        assert argv[at + 1] == "h100"
        run = _dry_run(argv[:at] + argv[at + 2:])
        assert run.returncode in (0, 1), (label, run.stderr[-2000:])
        assert (run.returncode == 0) == fits, (label, peak, run.stdout[-3000:])
