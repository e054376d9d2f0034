"""The entry point of ``pretrain_gpt.py``: flags -> process groups -> :class:`Trainer`
(:mod:`odc_pp.training.trainer`, where the loop and the loss are described) -> exit status.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist

from odc_pp.runtime.host_memory import keep_freed_host_memory
from odc_pp.runtime.liveness import name_stalled_peers, start_heartbeat

from .arguments import parse_args_with_notes
from .components import cuda_ipc_layout
from .distributed import Topology, init_distributed, read_env, warm_up_topology
from .failures import exit_after_failure, is_peer_echo
from .hooks import TrainingHooks
from .job import Job
from .preemption import TrainingInterrupted
from .trainer import Trainer, TrainingStopped

__all__ = ["main", "train", "TrainingStopped"]

EXIT_STOPPED = 3


def train(job: Job, topo: Topology, *, out=sys.stdout,
          hooks: TrainingHooks | None = None) -> list[dict]:
    """Train; returns the logged records (rank 0; other ranks: [])."""
    return Trainer(job, topo, out=out, hooks=hooks).train()


def main(argv: list[str] | None = None, *, hooks: TrainingHooks | None = None,
         checked=None) -> int:
    """Entry point of pretrain_gpt.py: 0 done, 2 bad flags, 3 stopped (non-finite
    training), 4 interrupted by a signal (checkpoint saved, docs/preemption.md), 1
    failure."""
    env, code = read_env(), 0
    if "--dry-run" in (sys.argv[1:] if argv is None else argv):  # one rank, fake memory
        from .dry_run import main as dry_run_main
        return dry_run_main(argv)
    try:
        job, notes = _resolved(argv, env, checked)
    except ValueError as exc:
        if env.rank == 0:
            print(f"pretrain_gpt.py: error: {exc}", file=sys.stderr, flush=True)
        else:  # let rank 0 print first: torchrun stops the others when one exits
            time.sleep(3)
        return 2
    if env.rank == 0:
        for note in notes + job.notes:
            print(note, flush=True)
    args = job.args
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    heartbeat = None
    try:
        device = init_distributed(env, timeout_minutes=args.parallel.distributed_timeout_minutes,
                                  backend=args.parallel.distributed_backend)
        if device.type == "cpu":  # no page faults for re-allocated activations
            keep_freed_host_memory()
        heartbeat = start_heartbeat(job.layout, timeout_s=job.timeout_s)
        topo = Topology.for_job(job, env.rank, device)
        warm_up_topology(topo, timeout_s=job.timeout_s)
        job = job.with_layout(cuda_ipc_layout(topo))  # the flags checked again
        topo = dataclasses.replace(topo, layout=job.layout)
        train(job, topo, hooks=hooks)
        dist.barrier()
    except ValueError as exc:
        print(f"pretrain_gpt.py: rank {env.rank}: error: {exc}", file=sys.stderr, flush=True)
        exit_after_failure(exc, 2)
    except TrainingInterrupted as exc:  # saved (with --save) and stopped on a signal
        if env.rank == 0:
            print(f"pretrain_gpt.py: {exc}", file=sys.stderr, flush=True)
        code = exc.exit_code
    except TrainingStopped as exc:
        if env.rank == 0:
            print(f"pretrain_gpt.py: stopped: {exc}", file=sys.stderr, flush=True)
        exit_after_failure(exc, EXIT_STOPPED)
    except BaseException as exc:
        exc = name_stalled_peers(exc, rank=env.rank)  # a timeout: which peer stopped
        if is_peer_echo(exc):
            print(f"pretrain_gpt.py: rank {env.rank} failed because a peer rank went away "
                  f"({type(exc).__name__}: {exc}); the failing rank's message names the "
                  f"cause", file=sys.stderr, flush=True)
        else:
            print(f"pretrain_gpt.py: rank {env.rank} failed: {type(exc).__name__}: {exc}\n"
                  f"{traceback.format_exc(limit=4)}", file=sys.stderr, flush=True)
        exit_after_failure(exc, 1)
    if heartbeat is not None:
        heartbeat.stop()
    if dist.is_initialized():
        dist.destroy_process_group()
    return code


def _resolved(argv, env, checked) -> tuple[Job, tuple[str, ...]]:
    """The job and the parse's notes: as :func:`~odc_pp.training.flag_check.check_flags`
    resolved them (``checked``), else parsed and resolved here, once."""
    if checked is not None:
        return checked.job, checked.notes
    args, notes = parse_args_with_notes(argv)
    return args.resolve(env.world_size, env.local_world_size), tuple(notes)
