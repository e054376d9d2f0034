"""Restarts under torchrun's elastic agent: resume from the newest checkpoint, any world.

torchrun (``--max-restarts N``, with ``--nnodes MIN:MAX`` and a c10d rendezvous for a
changing number of nodes) restarts every worker with the same command line after a
failure, possibly with fewer (or more) workers. It tells them so in
``TORCHELASTIC_RESTART_COUNT``. On such a restart :func:`adopt_elastic_restart` points
``--load`` at ``--save`` when ``--save`` holds a checkpoint (the newest one that verifies
is then loaded, see :mod:`.resume`), so the job continues from its last save instead of
starting over or refusing. The world may have changed: the data plan keeps
``--global-batch-size`` (each replica runs more or fewer microbatches) and the optimizer
state is resharded by name to the new layout (:mod:`.resharding`). The log states the
restart, the checkpoint and what changed.
"""

from __future__ import annotations

import os
import sys

from .checkpointing import latest_iteration, read_meta

__all__ = ["restart_count", "adopt_elastic_restart"]


def restart_count() -> int:
    """torchrun's restart counter of this worker group (0: the first start)."""
    try:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    except ValueError:
        return 0


def _latest_in(save: str) -> int | None:
    try:
        return latest_iteration(save) if os.path.isdir(save) else None
    except ValueError:  # a broken `latest`: resume() reports it with the fix
        return -1


def _plan_on_rank0(args, topo) -> tuple[str | None, str]:
    """(directory to load or None, log line): rank 0's look at --save."""
    save = args.checkpoint.save
    found = _latest_in(save)
    if found is None:
        source = args.checkpoint.load
        return None, (f"elastic restart {restart_count()}: --save {save} holds no checkpoint "
                      f"yet; " + (f"loading --load {source} as given" if source
                                  else "training from scratch"))
    line = f"elastic restart {restart_count()}: resuming from the newest verified " \
           f"checkpoint in --save {save}"
    if found > 0:
        try:
            meta = read_meta(os.path.join(save, f"iter_{found:07d}"))
        except ValueError:
            meta = {}
        if meta.get("world_size") is not None:
            dp, mbs = topo.dp, args.data.micro_batch_size
            line += (f" (latest: iteration {found}, saved by {meta['world_size']} ranks, "
                     f"pp {meta.get('pp')} x dp {meta.get('dp')}); now {topo.world_size} "
                     f"ranks, pp {topo.pp} x dp {dp}; --global-batch-size "
                     f"{args.data.global_batch_size} kept")
            if not args.data.max_tokens_per_microbatch:
                per_replica = args.data.global_batch_size // (mbs * dp)
                line += f" ({per_replica} microbatches of {mbs} per replica)"
    return save, line


def adopt_elastic_restart(args, topo, *, out=None):
    """Collective: the checkpoint settings to load with. On an elastic restart with
    ``--save`` holding a checkpoint, ``args.checkpoint`` with ``load`` = ``--save`` and no
    ``finetune`` (the saved run is continued, not fine-tuned again); else
    ``args.checkpoint`` itself (the flags are never changed). Rank 0 decides from the
    file system and broadcasts, so every rank does the same."""
    if restart_count() == 0 or not args.checkpoint.save:
        return args.checkpoint
    import dataclasses

    import torch.distributed as dist

    box = [_plan_on_rank0(args, topo) if topo.rank == 0 else None]
    if dist.is_initialized() and topo.world_size > 1:
        dist.broadcast_object_list(box, src=0)
    load, line = box[0]
    if topo.rank == 0:
        print(line, file=out or sys.stdout, flush=True)
    if load is None:
        return args.checkpoint
    return dataclasses.replace(args.checkpoint, load=load, finetune=False)
