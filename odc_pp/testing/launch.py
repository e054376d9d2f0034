"""The one process launcher of the tests and benchmarks (used by nothing else in odc_pp).

``run_workers(fn, world_size, *args)`` spawns ``world_size`` processes, initialises a gloo
process group (127.0.0.1, a free port) in each, calls ``fn(rank, world_size, *args)`` and
returns the per-rank results (picklable) in rank order.

Contract:
* every wait has a deadline (``LaunchConfig.timeout_s``); on a timeout, an exception in any
  rank, or a rank that dies without a result, every child is killed and ``RuntimeError``
  names the rank (with its traceback when it raised);
* ``LaunchConfig.pass_queue``: ``fn`` is called as ``fn(rank, world_size, queue, *args)``
  and may put its own messages (tuples whose first item is not ``"ok"``/``"error"``) on
  the queue; ``on_message(message, processes)`` sees each one in the parent (e.g. to kill
  a rank once it reports ``"ready"``);
* ``LaunchConfig.expect``: the ranks whose results are awaited (default: all); the others'
  entries in the returned list are None, and those still alive once the awaited results
  are in are killed;
* the children fork from a forkserver that imported :data:`PRELOAD` once per parent
  process (a fresh interpreter per child spent most of a small test importing torch and
  megatron-core), or, where a CUDA device is visible, start fresh ("spawn": a process that
  initialised CUDA cannot fork a child that uses it); each child takes the parent's
  current environment, working directory and ``sys.path``, as a spawned one would;
* a child leaves with ``os._exit`` once its result is flushed into the queue's pipe and
  every rank passed a final barrier: torch 2.13's CPU build sometimes aborts during
  interpreter teardown after gloo use, which would fail a run that has succeeded. (Exiting
  before the flush can cut a message in half and block the parent's read for good.)
"""

from __future__ import annotations

import os
import queue
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

__all__ = ["LaunchConfig", "PRELOAD", "free_port", "run_workers"]

PRELOAD = ["torch", "torch.distributed", "odc_pp.megatron.model", "odc_pp.odc.engine",
           "odc_pp.runtime.runtime"]
"""What the forkserver imports before it forks a child (one that fails is skipped)."""


@dataclass(kw_only=True)
class LaunchConfig:
    """How :func:`run_workers` starts and supervises its processes."""

    timeout_s: float = 240.0
    """Wall-clock limit for all ranks together; children are killed when it passes."""
    process_group_timeout_s: float = 120.0
    """gloo's own timeout for a collective in the children."""
    threads_per_rank: int = 1
    """torch intra-op threads in each child (keep 1 on small shared machines)."""
    env: dict[str, str] | None = None
    """Extra environment variables for the children."""
    pass_queue: bool = False
    """Hand ``fn`` the message queue as its third argument."""
    expect: tuple[int, ...] | None = None
    """Ranks whose results to wait for (default: all)."""

    def __post_init__(self) -> None:
        if not self.timeout_s > 0 or not self.process_group_timeout_s > 0:
            raise ValueError("timeout_s and process_group_timeout_s must be > 0")
        if self.threads_per_rank < 1:
            raise ValueError(f"threads_per_rank must be >= 1, got {self.threads_per_rank}")


def _cuda_visible() -> bool:
    """A CUDA device is visible (by NVML where torch can, without initialising CUDA)."""
    import torch
    return torch.cuda.is_available()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _child(rank: int, world_size: int, port: int, config: LaunchConfig, fn: Callable,
           args: tuple, results, environment: dict[str, str]) -> None:
    os.environ.clear()
    os.environ.update(environment)
    os.environ.update(config.env or {})
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), OMP_NUM_THREADS=str(config.threads_per_rank))
    import torch
    import torch.distributed as dist

    torch.set_num_threads(config.threads_per_rank)
    code = 0
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=config.process_group_timeout_s))
        value = fn(rank, world_size, results, *args) if config.pass_queue else \
            fn(rank, world_size, *args)
        results.put(("ok", rank, value))
    except BaseException:  # report everything, including SystemExit from a peer's failure
        results.put(("error", rank, traceback.format_exc()))
        code = 1
    else:
        try:  # gloo aborts a rank whose peer tears down while it still talks
            dist.barrier()
        except Exception:  # noqa: BLE001 - a peer that was meant to die (expect) is gone
            pass
    results.close()
    results.join_thread()  # the message is in the pipe before the process ends
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_workers(fn: Callable, world_size: int, *args: Any, config: LaunchConfig | None = None,
                on_message: Callable | None = None) -> list[Any]:
    """``[fn(0, world_size, *args), ..., fn(world_size - 1, ...)]`` on separate processes."""
    import torch.multiprocessing as mp

    config = config or LaunchConfig()
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if _cuda_visible():  # importing megatron-core in the server may initialise CUDA,
        context = mp.get_context("spawn")  # which no forked child could use again
    else:
        context = mp.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)  # (read when the server starts: once)
    results = context.Queue()
    port = free_port()
    environment = dict(os.environ)
    processes = [context.Process(target=_child, daemon=True,
                                 args=(rank, world_size, port, config, fn, args, results,
                                       environment))
                 for rank in range(world_size)]
    for process in processes:
        process.start()
    waiting = set(range(world_size) if config.expect is None else config.expect)
    values: list[Any] = [None] * world_size
    deadline = time.monotonic() + config.timeout_s
    try:
        while waiting:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError(f"ranks {sorted(waiting)} did not finish within "
                                   f"{config.timeout_s:.0f} s")
            try:
                message = results.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                dead = [r for r in sorted(waiting) if processes[r].exitcode is not None]
                if not dead:
                    continue
                try:  # give a dying rank's report a moment to arrive before blaming it
                    message = results.get(timeout=2.0)
                except queue.Empty:
                    raise RuntimeError(f"rank {dead[0]} exited with code "
                                       f"{processes[dead[0]].exitcode} without a result")
            if message[0] == "ok":
                values[message[1]] = message[2]
                waiting.discard(message[1])
            elif message[0] == "error":
                raise RuntimeError(f"rank {message[1]} failed:\n{message[2]}")
            elif on_message is not None:
                on_message(message, processes)
        return values
    finally:
        awaited = set(range(world_size) if config.expect is None else config.expect)
        for rank, process in enumerate(processes):  # not awaited: meant to die or hang
            if rank not in awaited and process.is_alive():
                process.kill()
        for process in processes:
            process.join(timeout=10 if not waiting else 0.1)
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
