"""Preemption end to end (pretrain_gpt.py through torchrun, tiny GPT): SIGTERM to the
workers and to torchrun (SLURM's delivery; torchrun forwards it again) makes every rank
finish the iteration, save it and exit; --load continues bit-exactly;
--exit-duration-in-mins stops (and saves) on a wall-clock budget; a second job on the same
--save is refused at start, naming the first."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from odc_pp.testing.torchrun import TINY_MODEL, finish, launch, start

pytestmark = pytest.mark.multiproc

ITERS = 40
FLAGS = TINY_MODEL + ["--train-iters", str(ITERS), "--pipeline-schedule", "1f1b"]


def _records(path) -> list[dict]:
    if not path or not os.path.exists(path):
        return []
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip().endswith("}")]


def _wait_for(condition, what: str, process, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"torchrun exited ({process.returncode}) before {what}: "
                                 f"{process.stderr.read()[-4000:]}")
        if time.monotonic() > deadline:
            os.killpg(process.pid, signal.SIGKILL)
            raise AssertionError(f"no {what} within {timeout:.0f} s")
        time.sleep(0.05)


def _workers(torchrun: int) -> list[int]:
    """The odc_pp.train processes torchrun started (its children)."""
    found = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat") as handle:
                parent = int(handle.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{name}/cmdline", "rb") as handle:
                command = handle.read()
        except (OSError, ValueError, IndexError):
            continue
        if parent == torchrun and b"odc_pp.train" in command:
            found.append(int(name))
    return found


def test_slurms_sigterm_saves_the_current_iteration_and_load_continues_bit_exactly(tmp_path):
    """SLURM's recipe (docs/preemption.md): SLURM signals the workers and torchrun, and
    torchrun forwards its own SIGTERM a few ms later; the repeat must not kill the save."""
    ckpt = tmp_path / "ckpt"
    process, log = start(FLAGS + ["--save", str(ckpt)], nproc=2, tmp_path=tmp_path,
                         name="interrupted", launcher="torchrun")
    _wait_for(lambda: len(_records(log)) >= 3, "3 logged iterations", process)
    workers = _workers(process.pid)
    assert len(workers) == 2, workers
    for pid in workers:  # SLURM: every process of the job step ...
        os.kill(pid, signal.SIGTERM)
    time.sleep(0.01)
    process.send_signal(signal.SIGTERM)  # ... torchrun too, which forwards it again
    run = finish(process, log, name="interrupted", timeout=180)
    done = run.records()[-1]["iteration"]
    assert 3 <= done < ITERS, run.describe()
    assert f"SIGTERM received: every rank stopped after iteration {done}" in run.stdout, \
        run.describe()
    assert f"saved checkpoint {ckpt / f'iter_{done:07d}'}" in run.stdout, run.describe()
    assert (ckpt / "latest").read_text().strip() == str(done)
    assert "pretrain_gpt.py: interrupted: SIGTERM received" in run.stderr, run.describe()
    assert not (ckpt / ".odc-pp.lock").exists(), "the lock was not released"
    assert [name for name in os.listdir(ckpt) if name.startswith(".tmp")] == []

    until = ["--exit-interval", str(done + 3)]
    resumed = launch(FLAGS + ["--load", str(ckpt)] + until, nproc=2, tmp_path=tmp_path,
                     name="resumed")
    assert resumed.returncode == 0, resumed.describe()
    assert f"resumed from {ckpt} at iteration {done} (exact)" in resumed.stdout
    reference = launch(FLAGS + until, nproc=2, tmp_path=tmp_path, name="reference")
    assert reference.returncode == 0, reference.describe()
    assert run.losses() == reference.losses()[:done]
    assert [r["iteration"] for r in resumed.records()] == [done + 1, done + 2, done + 3]
    assert resumed.losses() == reference.losses()[done:], "resumed losses differ"


def test_exit_duration_stops_every_rank_with_a_save(tmp_path):
    ckpt = tmp_path / "ckpt"
    # 0.0001 minutes (6 ms) have passed before the first iteration ends: stop after it
    run = launch(FLAGS + ["--save", str(ckpt), "--exit-duration-in-mins", "0.0001"],
                 nproc=2, tmp_path=tmp_path, name="duration")
    assert run.returncode == 0, run.describe()
    assert ("--exit-duration-in-mins 0.0001 reached" in run.stdout and
            "every rank stopped after iteration 1" in run.stdout), run.describe()
    assert [r["iteration"] for r in run.records()] == [1]
    assert (ckpt / "latest").read_text().strip() == "1"


def test_a_second_job_on_the_same_save_fails_at_start_naming_the_first(tmp_path):
    ckpt = tmp_path / "ckpt"
    first, log = start(FLAGS + ["--save", str(ckpt), "--train-iters", "100000"], nproc=1,
                       tmp_path=tmp_path, name="first")
    lock = ckpt / ".odc-pp.lock"
    _wait_for(lambda: len(_records(log)) >= 1, "a logged iteration of the first job", first)
    holder = json.loads(lock.read_text())
    second = launch(FLAGS + ["--save", str(ckpt), "--load", str(ckpt)], nproc=1,
                    tmp_path=tmp_path, name="second")
    first.send_signal(signal.SIGTERM)
    first_run = finish(first, log, name="first", timeout=180)
    assert second.returncode != 0, second.describe()
    assert (f"--save {ckpt} is in use by job {holder['job_id']} (host {holder['host']}, pid "
            f"{holder['pid']}") in second.stderr, second.describe()
    assert not os.path.exists(second.log_path), "the second job trained"
    assert "SIGTERM received" in first_run.stdout, first_run.describe()
    assert not lock.exists()
