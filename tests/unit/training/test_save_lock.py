"""The ``--save`` lock under real races and across (fake) hosts: exactly one of 8
concurrent starters wins, a holder on another host keeps its lock while it refreshes its
heartbeat and loses it only after its lease, an earlier attempt of the same job is told
apart from another job reusing the id, and another job's ``.tmp_iter_*`` survives while its
lease is live (issue 34)."""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
import types

import pytest

from odc_pp.training.checkpoint.checkpointing import remove_leftovers
from odc_pp.training.checkpoint.save_lock import LOCK_NAME, SaveLock, current_owner, lock_save_dir

STARTERS, ROUNDS = 8, 100
WAIT_S = 120.0


def _dead_pid() -> int:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    return gone.pid


def _stale_lock(save: str, kind: str, dead_pid: int) -> None:
    """A lock left by a dead holder on this host, or by another job on another host whose
    lease expired long ago."""
    holder = dict(current_owner().__dict__, job_id="slurm-999", pid=dead_pid)
    if kind == "expired":
        holder.update(host="another-host", heartbeat=time.time() - 3600, lease_s=60.0)
    with open(os.path.join(save, LOCK_NAME), "w") as handle:
        json.dump(holder, handle)


def _starter(root: str, barrier, results) -> None:
    """One starter: every round, all 8 try to take the same lock at the same moment."""
    for index in range(ROUNDS):
        save = os.path.join(root, f"round_{index:03d}")
        barrier.wait(timeout=WAIT_S)
        try:
            lock = SaveLock.acquire(save, out=io.StringIO())
            outcome = "won"
        except ValueError as exc:
            lock, outcome = None, f"refused: {exc}"
        except Exception as exc:  # noqa: BLE001 - reported to the test, which fails on it
            lock, outcome = None, f"error: {type(exc).__name__}: {exc}"
        results.put((index, os.getpid(), outcome))
        barrier.wait(timeout=WAIT_S)  # every starter has tried while the winner holds it
        if lock is not None:
            lock.release()


def test_exactly_one_of_8_concurrent_starters_wins_in_each_of_100_rounds(tmp_path):
    dead = _dead_pid()
    kinds = ("fresh", "dead", "expired", "fresh directory")
    for index in range(ROUNDS):
        save = tmp_path / f"round_{index:03d}"
        kind = kinds[index % len(kinds)]
        if kind != "fresh directory":  # the last kind: the directory does not exist yet
            save.mkdir()
        if kind in ("dead", "expired"):
            _stale_lock(str(save), kind, dead)
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(STARTERS), context.Queue()
    starters = [context.Process(target=_starter, args=(str(tmp_path), barrier, results))
                for _ in range(STARTERS)]
    for process in starters:
        process.start()
    outcomes: dict[int, list[str]] = {}
    try:
        for _ in range(STARTERS * ROUNDS):
            index, _pid, outcome = results.get(timeout=WAIT_S)
            outcomes.setdefault(index, []).append(outcome)
    finally:
        for process in starters:
            process.join(timeout=WAIT_S)
            if process.is_alive():
                process.kill()
    errors = [o for found in outcomes.values() for o in found if o.startswith("error")]
    assert not errors, errors[:3]
    winners = {index: found.count("won") for index, found in outcomes.items()}
    wrong = {index: (kinds[index % len(kinds)], count) for index, count in winners.items()
             if count != 1}
    assert not wrong, f"rounds without exactly one winner (kind, winners): {wrong}"
    refusals = [o for found in outcomes.values() for o in found if o != "won"]
    assert len(refusals) == (STARTERS - 1) * ROUNDS
    assert all("is in use by job" in o for o in refusals), refusals[:3]
    assert not [name for name in os.listdir(tmp_path / "round_000") if name != "iter"], \
        "the lock or a temporary file was left behind"


# ----- two fake hosts -------------------------------------------------------------------------
HOLDER = """
import os, sys, time
from odc_pp.training.checkpoint.save_lock import SaveLock
lock = SaveLock.acquire(sys.argv[1])
os.makedirs(os.path.join(sys.argv[1], f".tmp_iter_0000005.{lock.token}", "rank_00000.pt"))
print(lock.token, flush=True)
time.sleep(600)
"""


def _start_holder(save, env) -> tuple[subprocess.Popen, str]:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(save)], env=env,
                              stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + WAIT_S
    while not (save / LOCK_NAME).exists():
        assert holder.poll() is None, f"the holder exited ({holder.returncode})"
        assert time.monotonic() < deadline, "the holder took no lock"
        time.sleep(0.05)
    return holder, holder.stdout.readline().strip()


def _heartbeats_span(save, span: float) -> list[float]:
    """Wait until the lock file's heartbeats (as refreshed by its holder) span ``span`` s."""
    seen: list[float] = []
    deadline = time.monotonic() + WAIT_S
    while not seen or seen[-1] - seen[0] <= span:
        assert time.monotonic() < deadline, f"the heartbeats did not span {span} s: {seen}"
        try:
            beat = json.loads((save / LOCK_NAME).read_text()).get("heartbeat")
        except (OSError, ValueError):
            beat = None
        if beat is not None and beat not in seen:
            seen.append(beat)
        time.sleep(0.05)
    return seen


def _start_job(save: str) -> str:
    """Another job's start, in the trainer's order: take the lock, then remove leftovers."""
    topo = types.SimpleNamespace(rank=0, world_size=1)
    out = io.StringIO()
    lock = lock_save_dir(save, topo, out=out)
    removed = remove_leftovers(save)
    lock.release()
    return out.getvalue() + f"removed {removed}"


def test_a_holder_on_another_host_keeps_the_lock_while_its_heartbeat_is_live(tmp_path,
                                                                           monkeypatch):
    save = tmp_path / "ckpt"
    lease = 1.0
    env = dict(os.environ, ODC_PP_HOST_ID="host-a", TORCHELASTIC_RUN_ID="my-job",
               ODC_PP_LOCK_LEASE_S=str(lease), PYTHONWARNINGS="ignore")
    for name in ("SLURM_JOB_ID", "SLURM_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"):
        env.pop(name, None)
        monkeypatch.delenv(name, raising=False)
    # this process is host b: the same --rdzv-id (the docs' "my-job"), the same attempt
    monkeypatch.setenv("ODC_PP_HOST_ID", "host-b")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "my-job")
    holder, token = _start_holder(save, env)
    try:
        ours = save / f".tmp_iter_0000005.{token}"
        beats = _heartbeats_span(save, 2 * lease)  # older than its lease, still refreshed
        assert len(beats) >= 3
        with pytest.raises(ValueError) as caught:
            _start_job(str(save))
        assert (f"--save {save} is locked by job torchrun-my-job (host host-a, pid "
                f"{holder.pid}") in str(caught.value)
        assert f"(lease {lease:g} s)" in str(caught.value)
        assert ours.is_dir(), "host b deleted host a's save in progress"
        assert json.loads((save / LOCK_NAME).read_text())["token"] == token
    finally:
        holder.send_signal(signal.SIGKILL)  # host a dies: no release, no more heartbeats
        holder.wait(timeout=WAIT_S)
    deadline = time.monotonic() + WAIT_S
    while True:  # the lease runs out a second after the last heartbeat
        try:
            started = _start_job(str(save))
            break
        except ValueError as exc:
            assert "whose heartbeat is" in str(exc), exc
            assert ours.is_dir(), "deleted while the lease was live"
            assert time.monotonic() < deadline, f"never taken over: {exc}"
            time.sleep(0.1)
    assert "the lease of job torchrun-my-job (host host-a" in started, started
    assert "expired (last heartbeat" in started and f"lease {lease:g} s)" in started
    assert f".tmp_iter_0000005.{token}" in started and not ours.exists()
    assert not (save / LOCK_NAME).exists()


def _holder_elsewhere(save, *, job: str, attempt: list[int]) -> None:
    owner = dict(current_owner().__dict__, host="host-a", job_id=job, pid=12345,
                 attempt=attempt, heartbeat=time.time(), lease_s=3600.0)
    (save / LOCK_NAME).write_text(json.dumps(owner))


@pytest.mark.parametrize("variable", ["TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT"])
def test_an_earlier_attempt_is_told_apart_from_another_job_with_the_same_id(
        tmp_path, monkeypatch, capsys, variable):
    monkeypatch.setenv("ODC_PP_HOST_ID", "host-b")
    for name in ("SLURM_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    (tmp_path / ".tmp_iter_0000004.0badf00d").mkdir()
    # the same job id, the same attempt, a live lease: another job reusing the id
    _holder_elsewhere(tmp_path, job="slurm-77", attempt=[0, 0])
    with pytest.raises(ValueError, match="is locked by job slurm-77 .* on another host"):
        _start_job(str(tmp_path))
    # a later attempt of the holder (it restarted since): still not ours to take
    monkeypatch.setenv(variable, "1")
    _holder_elsewhere(tmp_path, job="slurm-77", attempt=[0, 2] if variable.startswith("T")
                      else [2, 0])
    with pytest.raises(ValueError, match="whose heartbeat is 0 s old"):
        _start_job(str(tmp_path))
    assert (tmp_path / ".tmp_iter_0000004.0badf00d").is_dir()
    # an earlier attempt of this job (a restart or a requeue): taken over at once
    _holder_elsewhere(tmp_path, job="slurm-77", attempt=[0, 0])
    started = _start_job(str(tmp_path))
    assert "it was held by an earlier attempt of this job: job slurm-77 (host host-a" in \
        started
    assert "attempt 0.0," in started and ".tmp_iter_0000004.0badf00d" in started


def test_a_holder_whose_lock_was_taken_over_knows_it_and_leaves_the_new_one(tmp_path):
    lock = SaveLock.acquire(str(tmp_path), out=io.StringIO(), heartbeat=False)
    first = json.loads((tmp_path / LOCK_NAME).read_text())["heartbeat"]
    assert lock.refresh() and lock.lost == ""
    assert json.loads((tmp_path / LOCK_NAME).read_text())["heartbeat"] >= first
    # its lease ran out while it hung: a job on another host took the lock over
    _holder_elsewhere(tmp_path, job="slurm-5", attempt=[0, 0])
    assert not lock.refresh()
    assert "now names job slurm-5 (host host-a" in lock.lost
    lock.release()
    assert json.loads((tmp_path / LOCK_NAME).read_text())["job_id"] == "slurm-5"
