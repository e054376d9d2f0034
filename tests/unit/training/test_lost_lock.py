"""A job that lost its ``--save`` lock stops writing; the new holder never crashes on its
leftovers (issue 53 item 3). Two jobs on fake hosts in one process: job A's heartbeat
"stops" (no thread: as under SIGSTOP) and a fake clock runs its lease out, so each timing
of A against B is driven exactly, without sleeps. Every timing must leave one writer: B's
checkpoints, ``latest`` naming one of them, and B's lock."""

from __future__ import annotations

import io
import json
import os

import pytest
import torch

from odc_pp.training.checkpoint import checkpointing, save_lock
from odc_pp.training.checkpoint.checkpointing import (CheckpointSaver, latest_iteration,
                                                      load_rank_state, read_meta)
from odc_pp.training.checkpoint.save_lock import LOCK_NAME, LockLostError, SaveLock

LEASE = 2.0


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(save_lock, "_now", fake)
    return fake


def _job(save: str, host: str) -> tuple[SaveLock, CheckpointSaver]:
    lock = SaveLock.acquire(save, out=io.StringIO(), host=host, lease_s=LEASE, heartbeat=False)
    saver = CheckpointSaver(save, keep=10, rank=0, world_size=1, barrier=lambda: None,
                            token=lock.token, lock=lock)
    return lock, saver


def _state(value: float) -> dict:
    return {"x": torch.full((2,), value)}


def _b_takes_over(save: str, clock: Clock) -> tuple[SaveLock, CheckpointSaver]:
    """A stopped: no heartbeat for longer than its lease; job B (host b) takes over."""
    clock.now += LEASE + 1
    out = io.StringIO()
    lock = SaveLock.acquire(save, out=out, host="host-b", lease_s=LEASE, heartbeat=False)
    assert "the lease of job" in out.getvalue() and "expired" in out.getvalue()
    return lock, CheckpointSaver(save, keep=10, rank=0, world_size=1, barrier=lambda: None,
                                 token=lock.token, lock=lock)


def _one_writer(save: str, b: SaveLock, iterations: list[int], latest: int) -> None:
    names = sorted(os.listdir(save))
    assert names == sorted([LOCK_NAME, "latest"] + [f"iter_{i:07d}" for i in iterations]), names
    assert latest_iteration(save) == latest
    assert json.loads(open(os.path.join(save, LOCK_NAME)).read())["token"] == b.token
    assert read_meta(os.path.join(save, f"iter_{latest:07d}"))["writer"] == b.token


def test_a_stopped_between_saves_stops_at_its_next_save(tmp_path, clock):
    save = str(tmp_path)
    a, a_saver = _job(save, "host-a")
    a_saver.save(10, _state(1.0))
    b, b_saver = _b_takes_over(save, clock)
    b_saver.save(20, _state(2.0))
    with pytest.raises(LockLostError, match=r"this job lost its lock \(the lock .* now names"):
        a_saver.save(20, _state(-1.0))  # A resumed (SIGCONT): iteration 20 as well
    with pytest.raises(LockLostError):
        a_saver.save(30, _state(-1.0))
    _one_writer(save, b, [10, 20], 20)
    assert load_rank_state(os.path.join(save, "iter_0000020"), 0)["x"][0] == 2.0
    a.release()  # A's exit leaves B's lock
    _one_writer(save, b, [10, 20], 20)


def test_a_stopped_inside_a_save_renames_nothing(tmp_path, clock):
    save = str(tmp_path)
    a, a_saver = _job(save, "host-a")
    a_saver.save(10, _state(1.0))
    calls, jobs = [], []

    def a_stops_after_writing():  # the barrier after A's rank files are written
        calls.append(1)
        if len(calls) == 2:
            jobs.append(_b_takes_over(save, clock))
            jobs[0][1].save(20, _state(2.0))
    a_saver.barrier = a_stops_after_writing
    with pytest.raises(LockLostError):
        a_saver.save(20, _state(-1.0))
    b = jobs[0][0]
    _one_writer(save, b, [10, 20], 20)  # A's temporary directory is gone too
    assert load_rank_state(os.path.join(save, "iter_0000020"), 0)["x"][0] == 2.0


def test_a_stopped_just_before_its_rename_leaves_b_a_directory_b_replaces(tmp_path, clock,
                                                                         monkeypatch):
    """The window no check closes: A checked its lock, was stopped, B took over; A resumes,
    renames into iter_20 and then finds it lost the lock (before ``latest``). B's save of
    iteration 20 replaces A's directory instead of failing on it."""
    save = str(tmp_path)
    a, a_saver = _job(save, "host-a")
    a_saver.save(10, _state(1.0))
    real_fsync = checkpointing.fsync_dir
    jobs = []

    def fsync(path):  # A's flush of its temporary directory, right after its check
        if ".tmp_iter_0000020" in path and not jobs:
            jobs.append(_b_takes_over(save, clock))
        return real_fsync(path)
    monkeypatch.setattr(checkpointing, "fsync_dir", fsync)
    with pytest.raises(LockLostError):
        a_saver.save(20, _state(-1.0))
    assert read_meta(os.path.join(save, "iter_0000020"))["writer"] == a.token
    assert latest_iteration(save) == 10  # A wrote no ``latest``
    b, b_saver = jobs[0]
    b_saver.save(20, _state(2.0))  # previously: "cannot rename ... Directory not empty"
    _one_writer(save, b, [10, 20], 20)
    assert load_rank_state(os.path.join(save, "iter_0000020"), 0)["x"][0] == 2.0


def test_a_renewal_and_a_takeover_exclude_each_other(tmp_path, clock, monkeypatch):
    save = str(tmp_path)
    a, _ = _job(save, "host-a")
    clock.now += LEASE + 1  # A was stopped past its lease, but nobody took over yet
    assert a.refresh() and not a.lost  # A resumes first: it renews its lease
    with pytest.raises(ValueError, match="whose heartbeat is 0 s old"):
        SaveLock.acquire(save, out=io.StringIO(), host="host-b", lease_s=LEASE,
                         heartbeat=False)
    # B judges A stale, then A renews before B's claim: B judges again and is refused
    clock.now += LEASE + 1
    judge = SaveLock._takeover_reason
    verdicts = []

    def judge_then_a_renews(self, holder):
        verdict = judge(self, holder)
        verdicts.append(verdict)
        if len(verdicts) == 1:
            assert a.refresh()
        return verdict
    monkeypatch.setattr(SaveLock, "_takeover_reason", judge_then_a_renews)
    with pytest.raises(ValueError, match="whose heartbeat is 0 s old"):
        SaveLock.acquire(save, out=io.StringIO(), host="host-b", lease_s=LEASE,
                         heartbeat=False)
    assert len(verdicts) == 1 and "expired" in verdicts[0]
    monkeypatch.setattr(SaveLock, "_takeover_reason", judge)
    # while a takeover's claim stands, A cannot renew: it has lost the lock
    claim = save_lock._takeover_path(a.path, a.token)
    b = SaveLock(save, save_lock.current_owner(host="host-b", lease_s=LEASE))
    assert b._claim(claim, None)
    try:
        assert not a.refresh() and "another starter is taking over the lock" in a.lost
    finally:
        os.remove(claim)
    with pytest.raises(LockLostError, match="this job lost its lock"):
        a.check()


def test_the_heartbeat_and_a_saves_check_never_mistake_each_other_for_a_takeover(tmp_path):
    """Both renew through the same claim file: one at a time, never "lost"."""
    lock = SaveLock.acquire(str(tmp_path), out=io.StringIO(), lease_s=0.01)
    try:
        for _ in range(300):
            lock.check()
        assert not lock.lost
    finally:
        lock.release()
    assert not os.listdir(tmp_path)
