"""A stop goes before evaluation (issue 53, item 4): SIGTERM during the iteration after which
an evaluation is due skips that evaluation and saves at once; SIGTERM during an evaluation
cuts it short (the stop agreement is asked before every validation batch) and saves. Either
way the checkpoint of the iteration is written, every rank exits with the preemption status
and the --save lock is released -- before torchrun's SIGKILL, which a 600-batch evaluation
run first would outlast."""

from __future__ import annotations

import os
import signal

import pytest

from odc_pp.testing.torchrun import FAULTS, TINY_MODEL, finish, launch, start
from odc_pp.training.preemption import EXIT_PREEMPTED

from .test_preemption import _records, _wait_for, _workers

pytestmark = pytest.mark.multiproc

FLAGS = TINY_MODEL + ["--train-iters", "12", "--pipeline-schedule", "1f1b"]


def _assert_saved_without_evaluation(run, ckpt, done: int) -> None:
    assert f"evaluation after iteration {done} skipped or cut short, saving first: SIGTERM " \
           f"received" in run.stdout, run.describe()
    assert run.eval_records() == [], run.eval_records()
    assert f"saved checkpoint {ckpt / f'iter_{done:07d}'}" in run.stdout, run.describe()
    assert (ckpt / "latest").read_text().strip() == str(done)
    assert not (ckpt / ".odc-pp.lock").exists(), "the lock was not released"
    assert "pretrain_gpt.py: interrupted: SIGTERM received" in run.stderr, run.describe()


def test_sigterm_in_the_evaluation_iteration_skips_it_and_saves(tmp_path):
    ckpt = tmp_path / "ckpt"
    run = launch(FLAGS + ["--eval-interval", "10", "--eval-iters", "600", "--save", str(ckpt),
                          "--inject-sigterm-iter", "10"],
                 nproc=2, tmp_path=tmp_path, name="eval_due", entry=FAULTS)
    assert run.returncode != 0, run.describe()
    assert set(run.exit_codes().values()) == {EXIT_PREEMPTED}, run.describe()
    assert [r["iteration"] for r in run.records()] == list(range(1, 11))
    _assert_saved_without_evaluation(run, ckpt, 10)


def test_sigterm_during_an_evaluation_cuts_it_short_and_saves(tmp_path):
    """The signal comes while the evaluation after iteration 2 (1000 validation batches,
    by far the longest part of the run) is running: its record is logged before it."""
    ckpt = tmp_path / "ckpt"
    process, log = start(FLAGS + ["--eval-interval", "2", "--eval-iters", "1000", "--save",
                                  str(ckpt)],
                         nproc=2, tmp_path=tmp_path, name="in_eval", launcher="torchrun")
    _wait_for(lambda: len(_records(log)) >= 2, "2 logged iterations", process)
    workers = _workers(process.pid)
    assert len(workers) == 2, workers
    for pid in workers:
        os.kill(pid, signal.SIGTERM)
    run = finish(process, log, name="in_eval", timeout=180)
    assert [r["iteration"] for r in run.records()] == [1, 2], run.describe()
    _assert_saved_without_evaluation(run, ckpt, 2)
