"""The plan's post-validated zero-bubble rows (issue 48): their printed flags carry
--enable-optimizer-post-validation, and the printed dry-run command runs as printed with
the plan's verdict (the dry run counts the post-validation snapshot the plan counts)."""

from __future__ import annotations

from odc_pp.planner.post_validation import FLAG
from tests.e2e.training.test_one_memory_verdict import TINY, _dry_run, _planned

ZB = TINY + ["--schedules", "zb-h2", "--tp-sizes", "1", "--dp-modes", "odc"]


def test_post_validated_rows_dry_run_as_printed(capsys):
    rows = _planned(ZB, capsys)
    validated = [row for row in rows if FLAG in row[3]]
    assert validated, rows
    for label, fits, _, argv in validated:
        assert argv[argv.index("--pipeline-schedule") + 1] == "zb-h2"
        run = _dry_run(argv)
        assert run.returncode in (0, 1), (label, run.stderr[-2000:])
        assert run.returncode == (0 if fits else 1), (label, run.stdout[-2000:])
        assert "post_validation_snapshot" in run.stdout, run.stdout[-2000:]
