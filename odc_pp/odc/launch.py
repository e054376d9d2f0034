"""Run a function on N local processes with a gloo process group (tests, benchmarks).

``run_workers(fn, world_size, *args)`` spawns ``world_size`` processes, initialises
``torch.distributed`` (gloo, 127.0.0.1, a free port) in each, calls ``fn(rank, world_size,
*args)`` and returns the per-rank results (which must be picklable). Every wait has a
deadline; on an exception or timeout in any rank all children are killed and a
``RuntimeError`` carries the failing rank's traceback.
"""

from __future__ import annotations

import os
import queue
import socket
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["LaunchConfig", "free_port", "run_workers"]


@dataclass(kw_only=True)
class LaunchConfig:
    """How :func:`run_workers` starts and supervises its processes."""

    timeout_s: float = 180.0
    """Wall-clock limit for all ranks together; children are killed when it passes."""
    threads_per_rank: int = 1
    """torch intra-op threads in each child (keep 1 on small shared machines)."""
    env: dict[str, str] | None = None
    """Extra environment variables for the children."""

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.threads_per_rank < 1:
            raise ValueError(f"threads_per_rank must be >= 1, got {self.threads_per_rank}")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _child(rank: int, world_size: int, port: int, config: LaunchConfig, fn: Callable,
           args: tuple, results) -> None:
    import torch

    os.environ.update(config.env or {})
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(config.threads_per_rank)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=config.timeout_s))
        value = fn(rank, world_size, *args)
        results.put((rank, True, value))
        dist.barrier()  # gloo aborts a rank whose peer tears down while it still talks
    except BaseException:  # report everything, including SystemExit from a peer's failure
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_workers(fn: Callable, world_size: int, *args: Any,
                config: LaunchConfig | None = None) -> list[Any]:
    """``[fn(0, world_size, *args), ..., fn(world_size - 1, ...)]`` on separate processes."""
    config = config or LaunchConfig()
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    context = mp.get_context("spawn")
    results = context.Queue()
    port = free_port()
    processes = [context.Process(target=_child, daemon=True,
                                 args=(rank, world_size, port, config, fn, args, results))
                 for rank in range(world_size)]
    for process in processes:
        process.start()
    deadline = time.monotonic() + config.timeout_s
    values: dict[int, Any] = {}
    try:
        while len(values) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(set(range(world_size)) - set(values))
                raise RuntimeError(f"ranks {missing} did not finish within "
                                   f"{config.timeout_s:.0f} s")
            try:
                rank, ok, value = results.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                dead = [r for r, p in enumerate(processes)
                        if r not in values and p.exitcode is not None]
                if dead:
                    # Give a dying rank's report a moment to arrive before blaming it.
                    try:
                        rank, ok, value = results.get(timeout=2.0)
                    except queue.Empty:
                        raise RuntimeError(f"rank {dead[0]} exited with code "
                                           f"{processes[dead[0]].exitcode} without a result")
                else:
                    continue
            if not ok:
                raise RuntimeError(f"rank {rank} failed:\n{value}")
            values[rank] = value
    finally:
        for process in processes:
            process.join(timeout=5 if len(values) == world_size else 0.1)
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
    return [values[rank] for rank in range(world_size)]
