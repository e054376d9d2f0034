"""Spawn gloo worker processes with a free port, a deadline, and cleanup on failure."""

from __future__ import annotations

import os
import socket
import sys
import time
import traceback

import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _entry(rank, world_size, port, target, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), OMP_NUM_THREADS="1")
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=120))
    try:
        target(rank, world_size, *args)
    except BaseException:
        traceback.print_exc()
        raise
    else:
        dist.barrier()  # nobody tears down gloo while a peer still talks to it
    finally:
        dist.destroy_process_group()
    # The results are on disk. Leave without interpreter teardown: torch 2.13's CPU build
    # sometimes aborts there ("terminate called without an active exception") after
    # every collective has completed, which would fail a test that has passed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def launch(target, world_size: int, *args, timeout_s: float = 240.0) -> None:
    """Run ``target(rank, world_size, *args)`` in ``world_size`` spawned processes."""
    context = mp.start_processes(_entry, args=(world_size, free_port(), target, args),
                                 nprocs=world_size, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while not context.join(timeout=1.0):
            if time.monotonic() > deadline:
                raise TimeoutError(f"workers did not finish within {timeout_s}s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
                process.join(5)
