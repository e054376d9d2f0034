"""A lost ``--save`` lock stops every rank of a save, none hangs (issue 53 item 3): two
forked gloo ranks save with the real :func:`save_checkpoint`; rank 0's lock is taken over
by another job (a fake host) before the save, or while the rank files are written (found
before the rename). Every rank raises, nothing is renamed into ``iter_*``."""

from __future__ import annotations

import datetime
import io
import json
import multiprocessing
import os

import pytest
import torch
import torch.distributed as dist

from odc_pp.training.checkpoint.checkpointing import CheckpointWriteError, save_checkpoint
from odc_pp.training.checkpoint.save_lock import LOCK_NAME, LockLostError, SaveLock, current_owner
from odc_pp.training.distributed import all_ranks_true

pytestmark = pytest.mark.multiproc

WORLD = 2
WAIT_S = 60.0


def _take_over(save: str) -> None:
    """Another job on another host replaces the lock (as after this one's lease ran out)."""
    owner = dict(current_owner(host="host-b").__dict__, job_id="slurm-5")
    with open(os.path.join(save, LOCK_NAME), "w") as handle:
        json.dump(owner, handle)


def _rank(rank: int, root: str, when: str, results) -> None:
    dist.init_process_group("gloo", init_method=f"file://{root}/store", rank=rank,
                            world_size=WORLD, timeout=datetime.timedelta(seconds=WAIT_S))
    save = f"{root}/ckpt"
    lock = SaveLock.acquire(save, out=io.StringIO(), host="host-a", heartbeat=False) \
        if rank == 0 else None
    token = [lock.token if lock else None]
    dist.broadcast_object_list(token, src=0)  # the job's token, as lock_save_dir shares it
    if rank == 0 and when == "before":
        _take_over(save)
    calls = []

    def barrier():  # the second barrier: every rank file written, before the rename
        calls.append(1)
        if rank == 0 and when == "during" and len(calls) == 2:
            _take_over(save)
        dist.barrier()
    try:
        save_checkpoint(save, 10, {"x": torch.ones(4)}, rank=rank, world_size=WORLD,
                        barrier=barrier, token=token[0],
                        agree=all_ranks_true, lock=lock)
        results.put((rank, "saved"))
    except (LockLostError, CheckpointWriteError) as exc:
        results.put((rank, f"{type(exc).__name__}: {exc}"))
    dist.destroy_process_group()


@pytest.mark.parametrize("when", ["before", "during"])
def test_every_rank_stops_when_rank_0_lost_the_lock(tmp_path, when):
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    ranks = [context.Process(target=_rank, args=(rank, str(tmp_path), when, results))
             for rank in range(WORLD)]
    for process in ranks:
        process.start()
    outcomes = dict(results.get(timeout=WAIT_S) for _ in range(WORLD))
    for process in ranks:
        process.join(timeout=WAIT_S)
    assert outcomes[0].startswith(f"LockLostError: --save {tmp_path}/ckpt: this job lost its "
                                  f"lock (the lock {tmp_path}/ckpt/{LOCK_NAME} now names job "
                                  f"slurm-5 (host host-b"), outcomes
    if when == "before":  # every rank learns it before writing anything
        assert outcomes[1].startswith("LockLostError: ") and "rank 0 found" in outcomes[1]
    else:
        assert outcomes[1].startswith("CheckpointWriteError: checkpoint ") and \
            "rank 0 could not finish it" in outcomes[1], outcomes
    assert sorted(os.listdir(tmp_path / "ckpt")) == [LOCK_NAME]  # nothing written or left
