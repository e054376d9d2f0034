"""Atomic, checksummed checkpoint directories -- the one checkpoint format of odc-pp.

Layout: ``SAVE/iter_0000010/rank_00003.pt`` (one file per rank: its optimizer shard with
the units' parameter layout, RNG states, ...), ``SAVE/iter_0000010/meta.json`` and
``SAVE/latest`` (the newest complete iteration).

Rank files. Each starts with a fixed-size header -- format tag, SHA-256 and length of the
payload (a ``torch.save`` stream) -- checked by :func:`load_rank_state`: a truncated,
overwritten or missing file raises :class:`CorruptCheckpointError` naming the file.

Saving (:func:`save_checkpoint`, collective). Every rank writes and fsyncs its file
inside ``SAVE/.tmp_iter_0000010``; after a barrier rank 0 writes ``meta.json``, fsyncs the
directory, renames it to ``iter_0000010`` (atomic on one file system) and rewrites
``latest`` atomically. A crash leaves the previous complete checkpoint or the new one,
never a partial one under a final name. An existing ``iter_*`` directory is never
overwritten.

Retention (:class:`CheckpointSaver`). Only checkpoints this run wrote are pruned (never the
one just saved, never the one ``latest`` names); a pruned directory is first renamed to
``.prune_iter_*`` and then deleted, so an interrupted prune leaves no partial directory
under a final name. Leftover ``.tmp_iter_*`` / ``.prune_iter_*`` directories are removed by
:func:`remove_leftovers`.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import random
import re
import shutil
import sys
from typing import Callable

import numpy as np
import torch

from odc_pp.fsutil import fsync_dir, write_file_atomic

from .save_lock import LockLostError

__all__ = ["LATEST", "CorruptCheckpointError", "UntrustedCheckpointError", "safe_globals", "CheckpointSaver", "checkpoint_dir",
           "rank_file", "list_iterations", "write_rank_file", "load_rank_state", "read_meta",
           "save_checkpoint", "CheckpointWriteError", "prune_checkpoint", "remove_leftovers",
           "latest_iteration",
           "read_latest", "save_dir_problem", "checkpoint_bytes", "free_space_problem", "capture_rng_state",
           "restore_rng_state"]

LATEST = "latest"
_ITER = re.compile(r"^iter_(\d{7,})$")
_LEFTOVER = re.compile(r"^\.(tmp|prune)_iter_\d{7,}(\.[0-9a-f]+)?$")
_TAG = b"odc-pp rank file v1"
# tag, sha256 (64 hex), payload length (20 digits): a fixed-size first line
_HEADER = len(_TAG) + 1 + 64 + 1 + 20 + 1


class CorruptCheckpointError(ValueError):
    """A checkpoint file is missing, truncated or fails its checksum (the message names it)."""


def checkpoint_dir(save: str, iteration: int) -> str:
    return os.path.join(save, f"iter_{iteration:07d}")


def rank_file(directory: str, rank: int) -> str:
    return os.path.join(directory, f"rank_{rank:05d}.pt")


def list_iterations(save: str) -> list[int]:
    """Iterations of the complete-named ``iter_*`` directories under ``save``, ascending."""
    if not os.path.isdir(save):
        return []
    return sorted(int(match.group(1)) for match in map(_ITER.match, os.listdir(save))
                  if match and os.path.isdir(os.path.join(save, match.group(0))))


# ----- RNG states ---------------------------------------------------------------------------
def _megatron_tracker():
    """megatron-core's CUDA RNG tracker (tensor-parallel / dropout streams), or None when
    megatron-core is missing."""
    try:
        from megatron.core.tensor_parallel import random as megatron_random
    except ImportError:
        return None
    return megatron_random.get_cuda_rng_tracker()


def capture_rng_state() -> dict:
    """This rank's RNG streams: Python, NumPy, torch's CPU generator and, on a GPU run,
    the current device's CUDA generator and megatron-core's tracker states (the model-
    parallel stream its dropout forks into)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
        tracker = _megatron_tracker()
        if tracker is not None:
            states = tracker.get_states()
            tensors = {name: value.clone() for name, value in states.items()
                       if torch.is_tensor(value)}
            if len(tensors) != len(states):
                raise ValueError("megatron-core's RNG tracker holds CUDA-graph generators "
                                 "(use_cudagraphable_rng), which checkpoints cannot carry")
            state["megatron_tracker"] = tensors
    return state


def restore_rng_state(state: dict) -> None:
    """Set the streams of :func:`capture_rng_state`. The CUDA parts are restored when this
    run uses CUDA (a GPU checkpoint resumed on CPU keeps only the host streams)."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return
    if "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"])
    tracker = _megatron_tracker()
    if "megatron_tracker" in state and tracker is not None:
        tracker.set_states(state["megatron_tracker"])


# ----- rank files ---------------------------------------------------------------------------
def write_rank_file(path: str, state: dict) -> None:
    """``torch.save(state)`` behind a checksum header; flushed and fsynced."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getbuffer()
    header = b"%s %s %020d\n" % (_TAG, hashlib.sha256(payload).hexdigest().encode(),
                                 len(payload))
    with open(path, "wb") as handle:
        handle.write(header)
        handle.write(payload)
        handle.flush()
        os.fsync(handle.fileno())


def _read_verified(path: str) -> bytes:
    """The payload of a rank file after checking its length and checksum."""
    try:
        with open(path, "rb") as handle:
            header = handle.read(_HEADER)
            payload = handle.read()
    except FileNotFoundError:
        raise CorruptCheckpointError(f"checkpoint file {path} is missing") from None
    if len(header) < _HEADER:
        if _TAG.startswith(header[:len(_TAG)]):
            raise CorruptCheckpointError(f"checkpoint file {path} is truncated "
                                         f"({len(header)} bytes, not even a header)")
        raise CorruptCheckpointError(f"{path} is not an odc-pp rank file (no checksum header)")
    fields = header.split()
    if (len(fields) != len(_TAG.split()) + 2 or header[:len(_TAG)] != _TAG
            or not fields[-1].isdigit()):
        raise CorruptCheckpointError(f"{path} is not an odc-pp rank file (no valid checksum "
                                     f"header; written by another program or damaged)")
    digest, size = fields[-2].decode(), int(fields[-1])
    if len(payload) < size:
        raise CorruptCheckpointError(f"checkpoint file {path} is truncated: {len(payload)} of "
                                     f"{size} payload bytes")
    if len(payload) > size:
        raise CorruptCheckpointError(f"checkpoint file {path} has {len(payload) - size} bytes "
                                     f"more than its header says")
    if hashlib.sha256(payload).hexdigest() != digest:
        raise CorruptCheckpointError(f"checkpoint file {path} fails its SHA-256 checksum (the "
                                     f"content was changed or damaged after it was saved)")
    return payload


class UntrustedCheckpointError(ValueError):
    """A checkpoint file holds a type our files never contain (a crafted or foreign pickle);
    it was not loaded and none of its code ran (the message names the file)."""


def safe_globals() -> list:
    """The only non-tensor types a rank file may hold besides Python's builtin containers
    and numbers (everything else is refused by ``torch.load(weights_only=True)``): NumPy's
    RNG state, an ``ndarray`` of ``uint32``."""
    from numpy._core.multiarray import _reconstruct

    return [_reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def _refusal(message: str) -> str:
    """What ``torch.load(weights_only=True)`` refused, without its advice to load the file
    unsafely."""
    found = re.search(r"GLOBAL (\S+) (was not an allowed global|whose module)", message)
    if found:
        return f"it imports {found.group(1)}"
    advice = ("weights_only", "Weights only", "Check the documentation", "Please file an issue")
    lines = [line.strip() for line in message.splitlines()
             if line.strip() and not any(text in line for text in advice)]
    return lines[0] if lines else "torch.load(weights_only=True) refused it"


def load_rank_state(directory: str, rank: int) -> dict:
    """The state rank ``rank`` saved into a checkpoint directory, verified against its
    checksum (:class:`CorruptCheckpointError` names a bad file) and unpickled without
    executing code: ``weights_only=True`` with :func:`safe_globals` only
    (:class:`UntrustedCheckpointError` names a file holding anything else)."""
    path = rank_file(directory, rank)
    payload = _read_verified(path)
    try:
        with torch.serialization.safe_globals(safe_globals()):
            return torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:  # a valid checksum: written like this on purpose
        raise UntrustedCheckpointError(
            f"checkpoint file {path} holds something odc-pp rank files never contain, so it "
            f"was not loaded and none of its code ran (it was crafted or written by another "
            f"program; see docs/checkpoints.md): {_refusal(str(exc))}") from None
    except Exception as exc:  # checksum matched: written this way, not damaged later
        raise CorruptCheckpointError(f"checkpoint file {path} cannot be unpickled: "
                                     f"{exc}") from exc


def read_meta(directory: str) -> dict:
    """The meta.json of a checkpoint directory (model, layout, iteration, world size)."""
    path = os.path.join(directory, "meta.json")
    if not os.path.isdir(directory):
        raise ValueError(f"{directory} is not a complete odc-pp checkpoint (no meta.json)")
    if not os.path.isfile(path):  # rank 0 writes it before the directory gets its name
        raise CorruptCheckpointError(f"{directory} is not a complete odc-pp checkpoint (no "
                                     f"meta.json: {path} was removed)")
    try:
        with open(path) as handle:
            meta = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptCheckpointError(f"checkpoint file {path} is unreadable: {exc}") from exc
    if not isinstance(meta, dict) or "world_size" not in meta:
        raise CorruptCheckpointError(f"checkpoint file {path} lacks the world size")
    return meta


# ----- saving and retention -----------------------------------------------------------------
def save_checkpoint(save: str, iteration: int, state: dict, *, rank: int, world_size: int,
                    barrier: Callable[[], None], meta: dict | None = None, token: str = "",
                    agree: Callable[[bool], bool] | None = None, lock=None) -> str:
    """Collective over all ranks (each passes its own ``state``); returns the final path.
    Refuses (RuntimeError) to replace an existing ``iter_*`` directory.

    ``token`` (the job's, :class:`~.save_lock.SaveLock`) makes the temporary directory
    ``.tmp_iter_N.TOKEN`` unique per job. ``agree(ok) -> all ranks ok`` (an all-reduce)
    lets every rank learn of another rank's failed write: then the temporary directory is
    removed and every rank raises :class:`CheckpointWriteError` naming the path.

    ``lock`` (rank 0's :class:`~.save_lock.SaveLock`): checked before the first write and
    again before the rename and before ``latest``; a job that lost it raises
    :class:`~.save_lock.LockLostError` on every rank and writes nothing more. The holder
    removes an ``iter_*`` of this iteration that a job which had lost the lock left."""
    final = checkpoint_dir(save, iteration)
    tmp = os.path.join(save, f".tmp_iter_{iteration:07d}" + (f".{token}" if token else ""))
    _start_save(save, final, tmp, rank=rank, token=token, agree=agree, lock=lock)
    barrier()
    path = rank_file(tmp, rank)
    error = None
    try:
        _named(lambda: write_rank_file(path, state), path, "write")
    except CheckpointWriteError as exc:
        error = exc
        _remove_quietly(path)
    if agree is not None and not agree(error is None):
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        barrier()
        raise error or CheckpointWriteError(
            f"checkpoint {final} was not saved: another rank could not write its file into "
            f"{tmp} (its message names the path); the partial directory was removed")
    if error is not None:  # without agreement: this rank leaves, its peers' barrier fails
        raise error
    barrier()
    failure = None
    if rank == 0:
        try:
            writer = {"writer": token} if token else {}  # whose save (:func:`_remove_intruder`)
            _finish_save(save, tmp, final, iteration, world_size, dict(meta or {}, **writer),
                         lock)
        except Exception as exc:  # every rank learns of it below (with ``agree``)
            failure = exc
        finally:
            if os.path.isdir(tmp):  # not renamed: failed or interrupted
                shutil.rmtree(tmp, ignore_errors=True)
    if _failed_somewhere(failure, agree):
        raise failure or CheckpointWriteError(
            f"checkpoint {final} was not saved: rank 0 could not finish it (its message says "
            f"why); the partial directory was removed")
    if agree is None:
        barrier()
    return final


def _start_save(save: str, final: str, tmp: str, *, rank: int, token: str, agree,
                lock) -> None:
    """Rank 0 checks the lock (every rank learns a loss through ``agree`` and raises),
    then makes the temporary directory; an existing ``final`` is refused unless a job that
    had lost the lock wrote it."""
    lost = None
    if rank == 0:
        try:
            _check_lock(lock)
        except LockLostError as exc:
            lost = exc
    if _failed_somewhere(lost, agree):
        raise lost or LockLostError(f"--save {save}: rank 0 found that this job lost its lock "
                                    f"(its message says why); writing nothing more there")
    if rank == 0:
        if os.path.exists(final) and not _remove_intruder(final, token):
            raise RuntimeError(f"{final} exists already; a checkpoint is never overwritten "
                               f"(resume with --load {save}, or give a new --save directory)")
        _named(lambda: os.makedirs(save, exist_ok=True), save, "create")
        shutil.rmtree(tmp, ignore_errors=True)
        _named(lambda: os.makedirs(tmp), tmp, "create")


def _failed_somewhere(error: BaseException | None, agree) -> bool:
    """Whether any rank has ``error`` (every rank learns it through ``agree``)."""
    if agree is None:
        return error is not None
    return not agree(error is None)


def _check_lock(lock) -> None:
    """Rank 0: LockLostError when this job no longer holds ``--save`` (None: no lock)."""
    if lock is not None:
        lock.check()


def _remove_intruder(final: str, token: str) -> bool:
    """Remove ``final`` when a job that had lost the lock wrote it (its meta.json names
    another writer token; this job holds the lock, checked just before); False otherwise."""
    try:
        with open(os.path.join(final, "meta.json")) as handle:
            writer = json.load(handle).get("writer")
    except (OSError, ValueError, AttributeError):
        return False
    if not token or not writer or writer == token:
        return False
    doomed = os.path.join(os.path.dirname(final), "." + "prune_" + os.path.basename(final))
    shutil.rmtree(doomed, ignore_errors=True)
    os.rename(final, doomed)
    shutil.rmtree(doomed)
    print(f"removed {final}: written (writer token {writer}) by a job that no longer held "
          f"the --save lock", file=sys.stderr, flush=True)
    return True


class CheckpointWriteError(OSError):
    """Writing a checkpoint failed (disk full, permissions, ...); the message names the
    path."""


def _named(action: Callable[[], object], path: str, verb: str):
    """Run ``action``; an OSError becomes a :class:`CheckpointWriteError` naming ``path``."""
    try:
        return action()
    except CheckpointWriteError:
        raise
    except OSError as exc:
        raise CheckpointWriteError(exc.errno, f"cannot {verb} checkpoint path {path}: "
                                   f"{exc.strerror or exc}") from exc


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def _finish_save(save: str, tmp: str, final: str, iteration: int, world_size: int,
                 meta: dict | None, lock=None) -> None:
    """Rank 0, every rank file written: meta.json, rename into place, ``latest`` (each
    rename only while this job holds ``lock``)."""
    missing = [r for r in range(world_size) if not os.path.isfile(rank_file(tmp, r))]
    if missing:
        raise RuntimeError(f"ranks {missing} wrote no checkpoint file into {tmp}: --save "
                           "must be a directory that every node can see (shared storage)")
    info = dict(meta or {}, iteration=iteration, world_size=world_size)
    meta_path = os.path.join(tmp, "meta.json")
    _named(lambda: write_file_atomic(meta_path, json.dumps(info).encode()), meta_path, "write")
    _check_lock(lock)
    _named(lambda: fsync_dir(tmp), tmp, "flush")
    if os.path.exists(final):  # left by a job that lost the lock while this one saved
        _remove_intruder(final, str(info.get("writer") or ""))
    _named(lambda: os.rename(tmp, final), final, "rename into")
    _named(lambda: fsync_dir(save), save, "flush")
    _check_lock(lock)
    latest = os.path.join(save, LATEST)
    _named(lambda: write_file_atomic(latest, f"{iteration}\n".encode()), latest, "write")


def prune_checkpoint(save: str, iteration: int) -> None:
    """Delete one checkpoint atomically: rename it out of the ``iter_*`` namespace, then
    delete the renamed directory (an interrupted delete leaves only a ``.prune_*`` name)."""
    doomed = os.path.join(save, f".prune_iter_{iteration:07d}")
    shutil.rmtree(doomed, ignore_errors=True)
    os.rename(checkpoint_dir(save, iteration), doomed)
    fsync_dir(save)
    shutil.rmtree(doomed)


def remove_leftovers(save: str) -> list[str]:
    """Delete ``.tmp_iter_*`` (a crashed save) and ``.prune_iter_*`` (an interrupted prune)
    directories under ``save``; returns their names. Never touches ``iter_*``."""
    if not os.path.isdir(save):
        return []
    names = sorted(name for name in os.listdir(save) if _LEFTOVER.match(name))
    for name in names:
        shutil.rmtree(os.path.join(save, name))
    return names


class CheckpointSaver:
    """Saves one run's checkpoints into ``save`` and keeps the newest ``keep`` of *them*:
    checkpoints this run did not write (resumed from, or of an earlier run) are never
    pruned, nor is the one just saved or the one ``latest`` names."""

    def __init__(self, save: str, *, keep: int, rank: int, world_size: int,
                 barrier: Callable[[], None], token: str = "",
                 agree: Callable[[bool], bool] | None = None, lock=None) -> None:
        if keep < 1:
            raise ValueError("keep must be >= 1 (--keep-checkpoints)")
        self.save_dir = save
        self.keep = keep
        self.rank = rank
        self.world_size = world_size
        self.barrier = barrier
        self.token = token
        """Job token of the temporary names (:func:`save_checkpoint`)."""
        self.agree = agree
        self.lock = lock
        """Rank 0's ``--save`` lock, checked before each write (:func:`save_checkpoint`)."""
        self.written: list[int] = []
        """Iterations this run saved and has not pruned, oldest first."""

    def save(self, iteration: int, state: dict, meta: dict | None = None) -> str:
        """Collective: save, then (rank 0) prune this run's older checkpoints."""
        path = save_checkpoint(self.save_dir, iteration, state, rank=self.rank,
                               world_size=self.world_size, barrier=self.barrier, meta=meta,
                               token=self.token, agree=self.agree, lock=self.lock)
        self.written.append(iteration)
        if len(self.written) > self.keep:
            protected = {iteration, latest_iteration(self.save_dir)}
            doomed = [it for it in self.written[:-self.keep] if it not in protected]
            if self.rank == 0:  # no other rank reads or writes these directories
                for old in doomed:
                    prune_checkpoint(self.save_dir, old)
            self.written = [it for it in self.written if it not in doomed]
        return path


# ----- finding checkpoints ------------------------------------------------------------------
def latest_iteration(load: str) -> int | None:
    """The iteration ``latest`` names, or None when there is no ``latest`` file."""
    path = os.path.join(load, LATEST)
    if not os.path.isfile(path):
        return None
    with open(path) as handle:
        text = handle.read().strip()
    if not text.isdigit() or not os.path.isdir(checkpoint_dir(load, int(text))):
        raise ValueError(f"{path} names no checkpoint ({text!r}); write the iteration of an "
                         f"existing iter_* directory into it, or fix --load")
    return int(text)


def read_latest(load: str) -> tuple[int, str, dict] | None:
    """(iteration, directory, meta) of the checkpoint ``latest`` names, or None."""
    iteration = latest_iteration(load)
    if iteration is None:
        return None
    directory = checkpoint_dir(load, iteration)
    return iteration, directory, read_meta(directory)


# ----- start-up checks of --save ------------------------------------------------------------
def save_dir_problem(save: str, rank: int) -> str | None:
    """Why this rank cannot write checkpoints into ``save`` (creates it), or None."""
    probe = os.path.join(save, f".probe_rank_{rank:05d}")
    try:
        os.makedirs(save, exist_ok=True)
        with open(probe, "wb") as handle:
            handle.write(b"odc-pp")
        os.remove(probe)
    except OSError as exc:
        return f"--save {save} is not writable by rank {rank}: {exc.strerror or exc}"
    return None


def checkpoint_bytes(state: dict) -> int:
    """Bytes :func:`write_rank_file` writes for ``state``: every distinct tensor storage
    (torch.save writes a shared storage once, 64-byte aligned) plus the pickled rest
    (serialized here with the tensors emptied) and the checksum header."""
    storages: dict[int, int] = {}
    count = 0

    def strip(value):
        nonlocal count
        if torch.is_tensor(value):
            storage = value.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
            count += 1
            return torch.empty(0, dtype=value.dtype)
        if isinstance(value, dict):
            return {key: strip(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(strip(item) for item in value)
        return value

    buffer = io.BytesIO()
    torch.save(strip(state), buffer)
    return _HEADER + len(buffer.getbuffer()) + sum(storages.values()) + 64 * len(storages)


def free_space_problem(save: str, needed_bytes: int) -> str | None:
    """Why ``save`` lacks room for ``needed_bytes`` more, or None."""
    free = shutil.disk_usage(save).free
    if free >= needed_bytes:
        return None
    return (f"--save {save} has {free / 2 ** 20:.1f} MiB free, this run's checkpoints need "
            f"about {needed_bytes / 2 ** 20:.1f} MiB; free space or give another --save "
            f"directory")
