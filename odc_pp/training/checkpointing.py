"""Atomic checkpoint directories.

Layout: ``SAVE/iter_0000010/rank_00003.pt`` (one file per rank: its model chunks,
optimizer shard, RNG states), ``SAVE/iter_0000010/meta.json`` and ``SAVE/latest``
(the newest complete iteration). Every rank writes and fsyncs its file inside
``SAVE/.tmp_iter_0000010``; after a barrier, rank 0 fsyncs the directory, renames it to
``iter_0000010`` (atomic on one file system), rewrites ``latest`` atomically and deletes
all but the newest ``keep`` checkpoints. A crash at any point leaves either the previous
complete checkpoint or the new one, never a partial one under its final name.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Callable

import torch

from odc_pp.fsutil import fsync_dir, write_file_atomic

__all__ = ["save_checkpoint", "load_checkpoint", "read_latest", "read_meta", "load_rank_state",
           "latest_iteration", "checkpoint_dir"]

LATEST = "latest"


def checkpoint_dir(save: str, iteration: int) -> str:
    return os.path.join(save, f"iter_{iteration:07d}")


def _rank_file(directory: str, rank: int) -> str:
    return os.path.join(directory, f"rank_{rank:05d}.pt")


def save_checkpoint(save: str, iteration: int, state: dict, *, rank: int, world_size: int,
                    barrier: Callable[[], None], keep: int = 2, meta: dict | None = None) -> str:
    """Collective over all ranks (each passes its own ``state``); returns the final path."""
    if keep < 1:
        raise ValueError("keep must be >= 1 (--keep-checkpoints)")
    final = checkpoint_dir(save, iteration)
    tmp = os.path.join(save, f".tmp_iter_{iteration:07d}")
    if rank == 0:
        os.makedirs(save, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    barrier()
    path = _rank_file(tmp, rank)
    with open(path, "wb") as handle:
        torch.save(state, handle)
        handle.flush()
        os.fsync(handle.fileno())
    barrier()
    if rank == 0:
        missing = [r for r in range(world_size) if not os.path.isfile(_rank_file(tmp, r))]
        if missing:
            raise RuntimeError(f"ranks {missing} wrote no checkpoint file into {tmp}: --save "
                               "must be a directory that every node can see (shared storage)")
        info = dict(meta or {}, iteration=iteration, world_size=world_size)
        write_file_atomic(os.path.join(tmp, "meta.json"), json.dumps(info).encode())
        fsync_dir(tmp)
        replaced = final + ".replaced"
        if os.path.exists(final):  # re-saving an iteration: never leave no copy at all
            shutil.rmtree(replaced, ignore_errors=True)
            os.rename(final, replaced)
        os.rename(tmp, final)
        fsync_dir(save)
        shutil.rmtree(replaced, ignore_errors=True)
        write_file_atomic(os.path.join(save, LATEST), f"{iteration}\n".encode())
        _remove_old(save, keep)
    barrier()
    return final


def _remove_old(save: str, keep: int) -> None:
    iterations = sorted(int(name[5:]) for name in os.listdir(save)
                        if name.startswith("iter_") and name[5:].isdigit())
    for old in iterations[:-keep]:
        shutil.rmtree(checkpoint_dir(save, old), ignore_errors=True)


def latest_iteration(load: str) -> int | None:
    """The newest complete checkpoint's iteration, or None when there is none."""
    path = os.path.join(load, LATEST)
    if not os.path.isfile(path):
        return None
    with open(path) as handle:
        text = handle.read().strip()
    if not text.isdigit() or not os.path.isdir(checkpoint_dir(load, int(text))):
        raise ValueError(f"{path} names no checkpoint ({text!r}); remove it or fix --load")
    return int(text)


def read_latest(load: str) -> tuple[int, str, dict] | None:
    """(iteration, directory, meta) of the newest complete checkpoint, or None."""
    iteration = latest_iteration(load)
    if iteration is None:
        return None
    directory = checkpoint_dir(load, iteration)
    return iteration, directory, read_meta(directory)


def read_meta(directory: str) -> dict:
    """The meta.json of a checkpoint directory (layout, iteration, world size)."""
    with open(os.path.join(directory, "meta.json")) as handle:
        return json.load(handle)


def load_rank_state(directory: str, rank: int) -> dict:
    """The state rank ``rank`` saved into a checkpoint directory."""
    return torch.load(_rank_file(directory, rank), map_location="cpu", weights_only=False)


def load_checkpoint(load: str, *, rank: int, world_size: int,
                    expect_meta: dict | None = None) -> tuple[int, dict] | None:
    """(iteration, this rank's state) of the latest checkpoint, or None when there is none.

    ``expect_meta`` entries (e.g. pp, dp) must equal the saved ones: a checkpoint of a
    different parallel layout cannot be resumed rank by rank (see ``resharding``)."""
    found = read_latest(load)
    if found is None:
        return None
    iteration, directory, meta = found
    wanted = dict(expect_meta or {}, world_size=world_size)
    different = {k: (meta.get(k), v) for k, v in wanted.items() if meta.get(k) != v}
    if different:
        detail = ", ".join(f"{k}: saved {s} vs now {n}" for k, (s, n) in different.items())
        raise ValueError(f"checkpoint {directory} was saved with another layout ({detail}); "
                         "resume with the same --pipeline-model-parallel-size, world size "
                         "and schedule")
    return iteration, load_rank_state(directory, rank)
