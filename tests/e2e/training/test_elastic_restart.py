"""Elastic restart end to end: two torchrun agents on localhost (c10d rendezvous,
``--nnodes 1:2 --max-restarts 1``, 2 workers each) train a tiny GPT at world size 4; one
agent is killed with its workers; the surviving agent restarts its workers at world size 2,
which resume from the newest checkpoint in --save (resharded dp 4 -> 2, the global batch
kept) and finish. Their losses after the restart equal a run resumed by hand from the same
checkpoint at world size 2. (Until odc_pp.training.distributed.elastic_restart_store, most
runs failed in gloo's connectFullMesh at the restart: torchrun shares its store across
restarts without a per-attempt prefix.)"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket

import pytest

from odc_pp.testing.torchrun import TINY_MODEL, finish, launch, start
from .test_preemption import _wait_for

pytestmark = pytest.mark.multiproc

ITERS = 80  # long enough that the kill lands mid-run on a loaded machine
FLAGS = TINY_MODEL + ["--train-iters", str(ITERS), "--pipeline-schedule", "1f1b"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (torchrun starts its workers in their own sessions)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    parent = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _kill_node(process) -> None:
    """SIGKILL a torchrun agent and all its workers at once: the node is gone."""
    victims = [process.pid] + _descendants(process.pid)
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_killed_node_restarts_at_a_smaller_world_and_matches_a_manual_resume(tmp_path):
    ckpt = tmp_path / "ckpt"
    flags = FLAGS + ["--save", str(ckpt), "--save-interval", "2"]
    port = _free_port()

    def agent(host: bool) -> list[str]:
        # heartbeats every second, a node is dead after 2 missed ones: the restart's
        # rendezvous must not count the killed node (with the defaults, 3 x 5 s, it could
        # still be a participant and the restarted ranks wait for it in gloo's connect)
        return ["--nnodes", "1:2", "--max-restarts", "1", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"elastic-{port}",
                "--rdzv-conf", f"is_host={int(host)},last_call_timeout=20,"
                               f"keep_alive_interval=1,keep_alive_max_attempt=2"]

    survivor, log = start(flags, nproc=2, tmp_path=tmp_path, name="elastic",
                          torchrun=agent(True))
    doomed, _ = start(flags, nproc=2, tmp_path=tmp_path, name="doomed", log=False,
                      torchrun=agent(False))
    try:
        _wait_for(lambda: (ckpt / "iter_0000004").is_dir(), "checkpoint iteration 4",
                  survivor, timeout=400)
        _kill_node(doomed)  # the node goes away with its 2 workers
        doomed.communicate()
        run = finish(survivor, log, name="elastic", timeout=300)
    finally:
        for process in (survivor, doomed):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    assert run.returncode == 0, run.describe()
    assert re.search(r"elastic restart \d: resuming from the newest verified checkpoint in "
                     r"--save", run.stdout), run.describe()
    resumed = re.search(rf"resumed from {re.escape(str(ckpt))} at iteration (\d+) "
                        rf"\(resharded \(([^)]*)\)", run.stdout)
    assert resumed, run.describe()
    start_at = int(resumed.group(1))
    assert "dp 4 -> 2" in resumed.group(2) and "world_size 4 -> 2" in resumed.group(2)
    after = run.records()[-(ITERS - start_at):]
    assert [r["iteration"] for r in after] == list(range(start_at + 1, ITERS + 1))
    assert all(r["microbatches_per_replica"] == [4, 4] for r in after)  # global batch 8

    by_hand = tmp_path / "by_hand"
    shutil.copytree(ckpt / f"iter_{start_at:07d}", by_hand / f"iter_{start_at:07d}")
    (by_hand / "latest").write_text(f"{start_at}\n")
    manual = launch(FLAGS + ["--load", str(by_hand)], nproc=2, tmp_path=tmp_path,
                    name="manual")
    assert manual.returncode == 0, manual.describe()
    assert [r["iteration"] for r in manual.records()] == [r["iteration"] for r in after]
    assert manual.losses() == [r["loss"] for r in after], "the restarted run's losses differ"
