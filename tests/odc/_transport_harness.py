"""Spawns gloo ranks for the transport tests; kills every child on failure or timeout."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
import time
import traceback
from datetime import timedelta


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _child(rank, world_size, port, fn, args, results, env):
    os.environ.update(env)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch.distributed as dist
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=60))
        value = fn(rank, world_size, results, *args)
        results.put(("ok", rank, value))
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put(("error", rank, traceback.format_exc()))
        return
    try:
        dist.barrier()  # gloo aborts a rank whose peer tears down while it still talks
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass


def spawn_ranks(world_size, fn, *args, env=None, timeout_s=120.0, on_message=None,
                expect=None):
    """Run fn(rank, world_size, results_queue, *args) on world_size gloo ranks. Returns
    {rank: value}. on_message(msg, procs) sees extra messages (e.g. 'ready') children put.
    expect: the ranks whose result to wait for (default all)."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_child, args=(r, world_size, port, fn, args, results, env or {}),
                         daemon=True) for r in range(world_size)]
    for proc in procs:
        proc.start()
    waiting = set(range(world_size) if expect is None else expect)
    values = {}
    deadline = time.monotonic() + timeout_s
    try:
        while waiting:
            try:
                message = results.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"ranks {sorted(waiting)} did not finish in {timeout_s} s")
            if message[0] == "ok":
                values[message[1]] = message[2]
                waiting.discard(message[1])
            elif message[0] == "error":
                raise AssertionError(f"rank {message[1]} failed:\n{message[2]}")
            elif on_message is not None:
                on_message(message, procs)
        return values
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
