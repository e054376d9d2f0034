"""Sharded checkpoints of a :class:`ShardedDataParallel` + :class:`ShardedAdamW` pair.

Layout of a checkpoint directory::

    meta.json                     data-parallel size, step, per-unit numel / names / shapes
    shard-00000-of-00002.pt       rank 0's owned elements [start, end) of every unit:
    shard-00001-of-00002.pt       fp32 master weights, exp_avg, exp_avg_sq

Saving is atomic: every rank writes and fsyncs its file inside ``<path>.tmp``, then (after a
barrier) rank 0 writes ``meta.json``, fsyncs the directory and renames it to ``<path>``; a
crash leaves either the previous checkpoint or none, never a mix. Loading at the same
data-parallel size restores every owned tensor exactly (training continues bit-exactly);
at another size each rank rebuilds its new range of every unit from the files it overlaps.
Frozen parameters and buffers are replicated, not sharded: save them with the model. Under
pipeline parallelism give each stage's engine its own directory (e.g. ``ckpt/stage-1``).
"""

from __future__ import annotations

import json
import os
import shutil

import torch
import torch.distributed as dist

from ..fsutil import fsync_dir
from .primitives import shard_range
from .sharded_optimizer import ShardedAdamW

__all__ = ["save_checkpoint", "load_checkpoint"]

_STATE_NAMES = ("master", "exp_avg", "exp_avg_sq")
_FORMAT = "odc-pp-sharded-v1"


def _shard_file(rank: int, world_size: int) -> str:
    return f"shard-{rank:05d}-of-{world_size:05d}.pt"


def _unit_meta(optimizer: ShardedAdamW) -> list[dict]:
    return [{"numel": unit.numel, "names": unit.names, "shapes": [list(s) for s in unit.shapes]}
            for unit in optimizer.engine.units]


def save_checkpoint(path: str, optimizer: ShardedAdamW) -> None:
    """Collective over ``optimizer.engine.process_group``: write this rank's shard."""
    engine = optimizer.engine
    group = engine.process_group
    rank, world_size = engine.group.rank, engine.group.world_size
    path = os.path.abspath(path)
    tmp = path + ".tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    dist.barrier(group=group)
    state = optimizer.state_dict()
    payload = {"rank": rank, "world_size": world_size, "step": state["step"],
               "ranges": [(unit.start, unit.end) for unit in engine.units]}
    for name in _STATE_NAMES:
        payload[name] = [tensor.cpu() for tensor in state[name]]
    target = os.path.join(tmp, _shard_file(rank, world_size))
    with open(target + ".part", "wb") as handle:
        torch.save(payload, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(target + ".part", target)
    dist.barrier(group=group)
    if rank == 0:
        meta = {"format": _FORMAT, "world_size": world_size, "step": state["step"],
                "units": _unit_meta(optimizer)}
        with open(os.path.join(tmp, "meta.json"), "w") as handle:
            json.dump(meta, handle)
            handle.flush()
            os.fsync(handle.fileno())
        fsync_dir(tmp)
        old = path + ".old"
        if os.path.exists(path):
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
        os.replace(tmp, path)
        fsync_dir(os.path.dirname(path))
        shutil.rmtree(old, ignore_errors=True)
    dist.barrier(group=group)


def load_checkpoint(path: str, optimizer: ShardedAdamW) -> int:
    """Collective: restore the owned shards and optimizer state saved by
    :func:`save_checkpoint` (any data-parallel size) and publish them. Returns the step."""
    engine = optimizer.engine
    path = os.path.abspath(path)
    meta_path = os.path.join(path, "meta.json")
    if not os.path.exists(meta_path):
        raise ValueError(f"{path} is not a complete odc-pp checkpoint (no meta.json)")
    with open(meta_path) as handle:
        meta = json.load(handle)
    if meta.get("format") != _FORMAT:
        raise ValueError(f"{path}: unknown checkpoint format {meta.get('format')!r}")
    if meta["units"] != _unit_meta(optimizer):
        raise ValueError(f"{path} holds a different model: units, parameter names or shapes "
                         f"differ from the engine's")
    saved_world = int(meta["world_size"])
    rank, world_size = engine.group.rank, engine.group.world_size
    if saved_world == world_size:
        payload = _read_shard(path, rank, saved_world)
        state = {"step": payload["step"], **{name: payload[name] for name in _STATE_NAMES}}
    else:
        state = _reshard(path, saved_world, engine)
    device = optimizer.master[0].device
    for name in _STATE_NAMES:
        state[name] = [tensor.to(device) for tensor in state[name]]
    optimizer.load_state_dict(state)
    engine.finish_step()
    return int(state["step"])


def _read_shard(path: str, rank: int, world_size: int) -> dict:
    return torch.load(os.path.join(path, _shard_file(rank, world_size)), map_location="cpu",
                      weights_only=True)


def _reshard(path: str, saved_world: int, engine) -> dict:
    """Assemble this rank's new ranges from the saved ranks whose ranges overlap them."""
    state = {name: [torch.zeros(unit.owned_numel, dtype=torch.float32) for unit in engine.units]
             for name in _STATE_NAMES}
    step = None
    for saved_rank in range(saved_world):
        needed = [_overlap(unit, *shard_range(unit.numel, saved_rank, saved_world))
                  for unit in engine.units]
        if all(lo >= hi for lo, hi in needed):
            continue
        payload = _read_shard(path, saved_rank, saved_world)
        step = payload["step"]
        for index, (unit, (lo, hi)) in enumerate(zip(engine.units, needed)):
            if lo >= hi:
                continue
            saved_start = payload["ranges"][index][0]
            for name in _STATE_NAMES:
                state[name][index][lo - unit.start:hi - unit.start].copy_(
                    payload[name][index][lo - saved_start:hi - saved_start])
    if step is None:  # this rank owns nothing (tiny model): take the step from rank 0
        step = _read_shard(path, 0, saved_world)["step"]
    state["step"] = step
    return state


def _overlap(unit, saved_start: int, saved_end: int) -> tuple[int, int]:
    return max(unit.start, saved_start), min(unit.end, saved_end)
