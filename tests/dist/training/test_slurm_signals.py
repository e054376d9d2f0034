"""SLURM's preemption as it is delivered (issue 34): SLURM signals every process of the job
step -- the workers and torchrun -- and torchrun forwards its own SIGTERM to the workers a
few ms later (and SIGTERMs the rest when one worker exits first). 20 tries, both orders,
0-50 ms apart: every one must save the iteration the ranks stopped after and exit 4.

The harness is the recipe without its start-up cost (20 torchrun launches would take
minutes on 2 cores): an agent process that does what torchrun's agent does with signals
(forward SIGTERM to every worker, SIGTERM the rest after a worker exits, SIGKILL after
30 s), and 2 forked gloo workers that run the real :class:`ExitController` (its
all-reduce agreement) and the real :func:`save_checkpoint`. The real torchrun +
``pretrain_gpt.py`` recipe, with a resume equal to the uninterrupted run, is
``tests/e2e/training/test_preemption.py``."""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

from odc_pp.training.checkpoint.checkpointing import (checkpoint_dir, latest_iteration, load_rank_state,
                                           save_checkpoint)
from odc_pp.training.distributed import all_ranks_true
from odc_pp.training.preemption import EXIT_PREEMPTED, ExitController, TrainingInterrupted

pytestmark = pytest.mark.multiproc

WORLD = 2
ITER_S = 0.02
"""One fake iteration's compute (sleep), before the per-iteration agreement."""
STATE = 1 << 20
"""Floats per rank file: a save takes some ms, so repeats also land during the save."""
WAIT_S = 60.0
AGENT_GRACE_S = 30.0
"""torchrun's wait between its forwarded SIGTERM and SIGKILL."""
TRIES = [(order, gap) for gap in (0, 1, 2, 5, 10, 15, 20, 30, 40, 50)
         for order in ("workers first", "torchrun first")]


def _worker(rank: int, root: str) -> None:
    """A training rank: iterations, the stop agreement, the save, exit status 4."""
    dist.init_process_group("gloo", init_method=f"file://{root}/store", rank=rank,
                            world_size=WORLD, timeout=datetime.timedelta(seconds=WAIT_S))
    exits = ExitController(signals=("SIGTERM",), train_iters=100_000).install()
    state = torch.zeros(STATE)
    progress = os.open(f"{root}/progress_{rank}", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    for iteration in range(1, 100_000):
        time.sleep(ITER_S)
        state += 1.0
        os.write(progress, f"{iteration}\n".encode())
        if exits.should_exit(iteration).stop:
            save_checkpoint(f"{root}/ckpt", iteration, {"x": state, "iteration": iteration},
                            rank=rank, world_size=WORLD, barrier=dist.barrier,
                            token="harness", agree=all_ranks_true)
            break
    try:
        exits.finish()
    except TrainingInterrupted as stopped:
        os._exit(stopped.exit_code)
    os._exit(0)


def _agent(root: str, report: int) -> None:
    """torchrun's agent, as far as signals go: forwards SIGTERM to its workers, SIGTERMs
    the others when one exits first, SIGKILLs after its grace; writes the exit codes."""
    workers = []
    for rank in range(WORLD):
        pid = os.fork()
        if pid == 0:
            try:
                _worker(rank, root)
            finally:
                os._exit(1)
        workers.append(pid)
    terminated: list[float] = []

    def terminate(*_):
        if not terminated:
            terminated.append(time.monotonic())
        for pid in workers:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, terminate)
    os.write(report, " ".join(map(str, workers)).encode() + b"\n")
    codes: dict[int, int] = {}
    while len(codes) < WORLD:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid:
            codes[pid] = os.waitstatus_to_exitcode(status)
            if codes[pid] != 0 and not terminated:
                terminate()  # a failed worker: torchrun stops the rest
            continue
        if terminated and time.monotonic() - terminated[0] > AGENT_GRACE_S:
            for pid in set(workers) - set(codes):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.002)
    os.write(report, " ".join(str(codes[pid]) for pid in workers).encode() + b"\n")


def _iterations(root: str, rank: int) -> int:
    try:
        with open(f"{root}/progress_{rank}") as handle:
            return len(handle.read().split())
    except FileNotFoundError:
        return 0


def _serve() -> None:
    """The agents' parent: a fresh interpreter (as torchrun is) that imports this module
    once and forks one agent per line ``ROOT`` on stdin; for each it prints ``AGENT_PID
    WORKER_PIDS...`` then, once the agent ended, ``WORKER_CODES... AGENT_STATUS``. Forking
    the pytest process instead, after earlier tests started threads, can leave a child stuck
    on a lock those threads held; a fresh interpreter per try cost 7 s of imports."""
    for line in sys.stdin:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(read)
                _agent(line.strip(), write)
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read) as report:
            print(pid, report.readline().strip(), flush=True)
            codes = report.readline().strip()
        _, status = os.waitpid(pid, 0)
        print(codes, os.waitstatus_to_exitcode(status), flush=True)


def _one_try(server: subprocess.Popen, root: str, order: str,
             gap_s: float) -> tuple[list[int], int]:
    """Start an agent, wait for 3 iterations, signal as SLURM does; the workers' exit codes
    and the iteration they stopped after. A failed try kills the agent and its workers."""
    os.makedirs(root)
    server.stdin.write(root + "\n")
    server.stdin.flush()
    agent, *workers = [int(pid) for pid in server.stdout.readline().split()]
    ended = False
    try:
        deadline = time.monotonic() + WAIT_S
        while min(_iterations(root, rank) for rank in range(WORLD)) < 3:
            assert time.monotonic() < deadline, "the workers did not run 3 iterations"
            time.sleep(0.01)
        first, then = (workers, [agent]) if order == "workers first" else ([agent], workers)
        for pid in first:
            os.kill(pid, signal.SIGTERM)
        time.sleep(gap_s)
        for pid in then:
            os.kill(pid, signal.SIGTERM)
        *codes, agent_status = [int(code) for code in server.stdout.readline().split()]
        ended = True  # the agent waits <= 30 s for its workers
        assert agent_status == 0
    finally:
        if not ended:
            for pid in [*workers, agent]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    return codes, max(_iterations(root, rank) for rank in range(WORLD))


def test_slurm_signals_workers_and_torchrun_0_to_50_ms_apart_every_try_saves(tmp_path):
    outcomes = []
    server = subprocess.Popen([sys.executable, os.path.abspath(__file__)], text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        for index, (order, gap_ms) in enumerate(TRIES):
            root = str(tmp_path / f"try_{index:02d}")
            codes, done = _one_try(server, root, order, gap_ms / 1000.0)
            saved = latest_iteration(f"{root}/ckpt")
            outcomes.append((order, gap_ms, codes, saved, done))
    finally:
        server.kill()
        server.wait()
    failed = [o for o in outcomes if o[2] != [EXIT_PREEMPTED] * WORLD or o[3] != o[4]]
    assert not failed, (f"{len(TRIES) - len(failed)} of {len(TRIES)} tries saved; failed "
                        f"(order, gap ms, exit codes, saved iteration, last iteration): "
                        f"{failed}")
    for index, (_, _, _, saved, _) in enumerate(outcomes):  # the state of that iteration
        directory = checkpoint_dir(str(tmp_path / f"try_{index:02d}" / "ckpt"), saved)
        for rank in range(WORLD):
            state = load_rank_state(directory, rank)
            assert state["iteration"] == saved and torch.equal(
                state["x"], torch.full((STATE,), float(saved)))


def test_a_signal_after_the_saves_grace_period_kills(tmp_path):
    """Repeats are absorbed until the save's grace period ends; a signal after it is the
    default action (the process dies by SIGTERM)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(read)
            now = [0.0]
            exits = ExitController(train_iters=10, grace_s=30.0, reduce=lambda mine: mine,
                                   clock=lambda: now[0]).install()
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)  # absorbed: nothing decided yet
            exits.should_exit(3)  # stop: the save starts, its grace period too
            now[0] = 29.0
            os.kill(os.getpid(), signal.SIGTERM)  # within the grace: absorbed
            now[0] = 31.0
            os.write(write, f"{exits.repeats} absorbed".encode())
            os.kill(os.getpid(), signal.SIGTERM)  # after it: dies here
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as said:
        absorbed = said.read()
    _, status = os.waitpid(pid, 0)
    assert absorbed == "2 absorbed"
    assert os.waitstatus_to_exitcode(status) == -signal.SIGTERM


if __name__ == "__main__":  # the agents' parent: python this_file (ROOT lines on stdin)
    _serve()
