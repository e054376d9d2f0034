"""One job per ``--save`` directory: a lock file naming the job that writes there.

``SAVE/.odc-pp.lock`` holds, as JSON, the job id (SLURM's job id, else torchrun's run id),
the host, the pid of rank 0 (and its start time in clock ticks, so a reused pid is not
mistaken for the holder), the torchrun agent's pid and when it was taken. Rank 0 creates it
with ``O_EXCL`` before anything is written into the directory:

* held by a **live** process (same host, pid alive with the same start time): refused, one
  ``ValueError`` naming the holder and the file;
* held by a **dead** process on this host, or by an earlier attempt of this job (the same
  job id, after an elastic restart, possibly on another host): taken over, with a message;
* held by another job on another host, whose liveness cannot be checked from here: refused,
  saying to delete the file if that job is gone.

The lock also yields the job's token (:attr:`SaveLock.token`), which makes the temporary
directory names of a save unique per job. A run that ends normally removes its lock; a
failing one removes it on its way out (:func:`~.failures.exit_after_failure`); a killed
one leaves it for the next start to take over.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import sys
import time
from dataclasses import asdict, dataclass

from .failures import at_failure_exit

__all__ = ["LOCK_NAME", "LockOwner", "SaveLock", "current_owner", "job_id", "lock_save_dir"]

LOCK_NAME = ".odc-pp.lock"


def job_id() -> str:
    """The scheduler's id of this job: SLURM's job id, torchrun's run id (``--rdzv-id``;
    ``none`` when not given), else the parent process (one job per launcher)."""
    if os.environ.get("SLURM_JOB_ID"):
        return f"slurm-{os.environ['SLURM_JOB_ID']}"
    run = os.environ.get("TORCHELASTIC_RUN_ID")
    if run and run != "none":
        return f"torchrun-{run}"
    return f"pid-{os.getppid()}@{socket.gethostname()}"


def _start_ticks(pid: int) -> int | None:
    """The process' start time in clock ticks since boot (Linux), None elsewhere/gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            text = handle.read()
    except OSError:
        return None
    try:  # the command name may hold spaces: fields after the last ')'
        return int(text.rsplit(")", 1)[1].split()[19])
    except (IndexError, ValueError):
        return None


def _alive(pid: int, ticks: int | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        pass
    if ticks is None:
        return True
    now = _start_ticks(pid)
    return now is None or now == ticks


@dataclass(frozen=True)
class LockOwner:
    """The content of a lock file."""

    job_id: str
    """:func:`job_id` of the holder."""
    host: str
    """Host name of the holder's rank 0."""
    pid: int
    """Process id of the holder's rank 0."""
    start_ticks: int | None
    """Start time of that process (``/proc/PID/stat``), against pid reuse."""
    agent_pid: int
    """Parent process (torchrun's agent) of rank 0."""
    token: str
    """Random token of the holder (its temporary names include it)."""
    since: str
    """When the lock was taken (UTC)."""

    def describe(self) -> str:
        return (f"job {self.job_id} (host {self.host}, pid {self.pid}, torchrun agent pid "
                f"{self.agent_pid}, since {self.since})")


def current_owner() -> LockOwner:
    pid = os.getpid()
    return LockOwner(job_id=job_id(), host=socket.gethostname(), pid=pid,
                     start_ticks=_start_ticks(pid), agent_pid=os.getppid(),
                     token=secrets.token_hex(4),
                     since=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))


def _read(path: str) -> LockOwner | None:
    """The owner recorded in ``path``; None when it is unreadable (a torn write)."""
    try:
        with open(path) as handle:
            data = json.load(handle)
        return LockOwner(**{key: data[key] for key in LockOwner.__dataclass_fields__})
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_new(path: str, owner: LockOwner) -> bool:
    """Create ``path`` holding ``owner``; False when it exists already."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as handle:
        json.dump(asdict(owner), handle)
        handle.flush()
        os.fsync(handle.fileno())
    return True


def _replace(path: str, owner: LockOwner) -> None:
    tmp = f"{path}.{owner.token}"
    with open(tmp, "w") as handle:
        json.dump(asdict(owner), handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


class SaveLock:
    """The lock of one ``--save`` directory held by this process (rank 0)."""

    def __init__(self, save: str, owner: LockOwner) -> None:
        self.save = save
        self.path = os.path.join(save, LOCK_NAME)
        self.owner = owner

    @property
    def token(self) -> str:
        return self.owner.token

    @classmethod
    def acquire(cls, save: str, *, out=None) -> "SaveLock":
        """Take the lock of ``save`` (created if missing) or raise ValueError naming the
        live holder (see the module doc)."""
        os.makedirs(save, exist_ok=True)
        lock = cls(save, current_owner())
        at_failure_exit(lock.release)  # a failed start or run leaves no lock behind
        if _write_new(lock.path, lock.owner):
            return lock
        holder = _read(lock.path)
        why = lock._takeover_reason(holder)
        _replace(lock.path, lock.owner)
        if _read(lock.path) != lock.owner:  # another starter took it over at the same time
            raise ValueError(f"--save {save}: another job took over the lock {lock.path} "
                             f"at the same time as this one; one job per --save directory")
        print(f"--save {save}: took over the lock {lock.path}: {why}", file=out or sys.stdout,
              flush=True)
        return lock

    def _takeover_reason(self, holder: LockOwner | None) -> str:
        """Why a held lock may be taken over; ValueError when it may not."""
        if holder is None:
            return "the lock file was unreadable (a torn write of a crashed start)"
        me = self.owner
        if holder.host == me.host and holder.pid == me.pid:
            return "this process held it already"
        if holder.host == me.host:
            if _alive(holder.pid, holder.start_ticks):
                raise ValueError(
                    f"--save {self.save} is in use by {holder.describe()}: one job per --save "
                    f"directory (a second one would overwrite or prune its checkpoints). Give "
                    f"this job another --save, or stop that job first (lock file {self.path})")
            same = " (an earlier attempt of this job)" if holder.job_id == me.job_id else ""
            return f"its holder {holder.describe()}{same} is no longer running"
        if holder.job_id == me.job_id and not holder.job_id.startswith("pid-"):
            return f"it was held by an earlier attempt of this job: {holder.describe()}"
        raise ValueError(
            f"--save {self.save} is locked by {holder.describe()} on another host, which this "
            f"host cannot check: one job per --save directory. If that job is gone, delete "
            f"{self.path}; otherwise give this job another --save")

    def release(self) -> None:
        """Remove the lock file if this process still holds it."""
        if _read(self.path) == self.owner:
            try:
                os.remove(self.path)
            except FileNotFoundError:
                pass


def lock_save_dir(save: str | None, topo, *, out=sys.stdout) -> SaveLock | None:
    """Collective, before anything is written into ``--save``: rank 0 takes the lock and
    every rank learns the outcome (a ValueError on every rank when refused). Returns the
    lock on rank 0; on other ranks an unheld stand-in carrying the job's token (for the
    temporary names); None without ``--save``."""
    if not save:
        return None
    import torch.distributed as dist

    lock, outcome = None, None
    if topo.rank == 0:
        try:
            lock = SaveLock.acquire(save, out=out)
            outcome = ("ok", lock.owner)
        except ValueError as exc:
            outcome = ("refused", str(exc))
        except OSError as exc:
            outcome = ("refused", f"--save {save} is not writable by rank 0: "
                                  f"{exc.strerror or exc}")
    box = [outcome]
    if dist.is_initialized() and topo.world_size > 1:
        dist.broadcast_object_list(box, src=0)
    kind, value = box[0]
    if kind == "refused":
        raise ValueError(value)
    return lock if lock is not None else _Unheld(save, value)


class _Unheld(SaveLock):
    """Another rank's view of rank 0's lock: the token, never released from here."""

    def release(self) -> None:
        return None
