"""Non-finite training stops with exit code 3 and names the iteration (it used to run to the
end with a NaN loss and exit 0). Under torchrun every worker exits 3 (torchrun itself then
exits 1 and lists the workers' codes); a single process exits 3 itself."""

import os
import subprocess
import sys

import pytest

from odc_pp.testing.torchrun import TINY_MODEL, launch


def _flags(*extra):
    flags = list(TINY_MODEL)
    flags[flags.index("--lr") + 1] = "1e30"
    flags[flags.index("--min-lr") + 1] = "0"
    return flags + ["--train-iters", "12", *extra]


@pytest.mark.multiproc
def test_huge_lr_stops_with_exit_3_naming_the_iteration(tmp_path):
    run = launch(_flags(), nproc=2, tmp_path=tmp_path, name="nan")
    assert run.returncode != 0 and list(run.exit_codes().values()) == [3, 3], run.describe()
    assert "stopped: iteration" in run.stderr and "--lr 1e+30" in run.stderr, run.describe()
    assert len(run.losses()) < 12  # stopped early, not at the end


@pytest.mark.multiproc
def test_post_validation_run_with_huge_lr_stops(tmp_path):
    run = launch(_flags("--enable-optimizer-post-validation", "--max-skipped-steps", "2",
                        "--pipeline-model-parallel-size", "2"),
                 nproc=2, tmp_path=tmp_path, name="skips")
    assert run.returncode != 0 and list(run.exit_codes().values()) == [3, 3], run.describe()
    assert "stopped: iteration" in run.stderr, run.describe()


def test_single_process_exit_code_is_3(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    done = subprocess.run([sys.executable, os.path.join(root, "pretrain_gpt.py"), *_flags()],
                          capture_output=True, text=True, timeout=300, cwd=root,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 3, done.stderr[-3000:]
    assert "stopped: iteration 2: the loss is nan" in done.stderr


def test_check_finite_counts_skipped_steps_in_a_row():
    from types import SimpleNamespace

    from odc_pp.training.arguments import parse_args
    from odc_pp.training.trainer import TrainingStopped, check_finite as _check_finite

    args = parse_args(["--mock-data", "--vocab-size", "64", "--max-skipped-steps", "3"])
    finite = SimpleNamespace(loss=2.0)
    _check_finite(finite, 7, 2, args)  # two skipped in a row: go on
    with pytest.raises(TrainingStopped, match=r"iteration 8: 3 optimizer steps in a row were "
                                              r"skipped .*--max-skipped-steps 3"):
        _check_finite(finite, 8, 3, args)
    with pytest.raises(TrainingStopped, match="iteration 1: the loss is inf"):
        _check_finite(SimpleNamespace(loss=float("inf")), 1, 0, args)
