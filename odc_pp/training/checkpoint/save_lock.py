"""One job per ``--save`` directory: a lock file naming the job that writes there.

``SAVE/.odc-pp.lock`` holds, as JSON, the job id (SLURM's job id, else torchrun's run id),
the attempt (``SLURM_RESTART_COUNT``, ``TORCHELASTIC_RESTART_COUNT``), the host, the pid
of rank 0 (and its start time in clock ticks, so a reused pid is not mistaken for the
holder), the torchrun agent's pid, a random token, the lease and the holder's last
heartbeat. Rank 0 takes it before anything is written into the directory:

* **Atomically.** The complete content is written to a temporary file which is then
  hard-linked to the lock name (``os.link`` fails when the name exists, on local file
  systems and NFS alike): of N concurrent starters exactly one creates the lock, and no
  reader ever sees a half-written one. Taking over a stale lock is atomic the same way:
  the starters that found the holder stale race to link ``.odc-pp.lock.takeover.TOKEN``
  (TOKEN: the stale holder's); the one winner re-checks that the lock still names that
  holder and replaces it, the others then see the new, live holder and are refused.
* **A lease.** The holder refreshes its heartbeat every ``lease / 4`` seconds (a thread
  of rank 0). The lease is :data:`LEASE_S` (60 s; ``ODC_PP_LOCK_LEASE_S`` sets another).
  A holder on another host is alive for as long as its heartbeat is younger than its
  lease (host clocks are assumed synchronised well within the lease, as NTP keeps them).

Who may take over a held lock:

* a holder on **this host** is alive when its pid runs with the recorded start time:
  then refused, one ``ValueError`` naming the holder and the file; a dead one is taken
  over, with a message;
* an **earlier attempt of this job** (the same job id and a lower attempt: an elastic
  restart or a SLURM requeue, whose earlier workers the launcher stopped first) is taken
  over at once, on any host;
* any other holder on **another host** is taken over only when its lease has expired.

This host's name is ``ODC_PP_HOST_ID`` when set (containers sharing a host name, tests
with fake hosts), else the host name. The lock also yields the job's token
(:attr:`SaveLock.token`), which makes the temporary directory names of a save unique per
job; leftovers (``.tmp_iter_*``) are removed only by the holder, so never while another
job's lease is live. A run that ends normally removes its lock; a failing one removes it
on its way out (:func:`~.failures.exit_after_failure`); a killed one leaves it for the
next start to take over (at once on the same host or by a later attempt, after the lease
from another host).
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass, field, replace

from ..failures import at_failure_exit

__all__ = ["LEASE_S", "LOCK_NAME", "TAKEOVER_WAIT_S", "LockLostError", "LockOwner", "SaveLock",
           "attempt", "current_owner", "host_id", "job_id", "lease_seconds", "lock_save_dir"]

LOCK_NAME = ".odc-pp.lock"

LEASE_S = 60.0
"""Seconds a holder's heartbeat stays valid; it is refreshed every quarter of that."""

TAKEOVER_WAIT_S = 30.0
"""How long a starter waits for another starter's takeover of the same stale lock to
finish before it gives up naming the takeover file."""


def _now() -> float:
    """The clock of heartbeats and lease ages (tests replace it to drive lease expiry)."""
    return time.time()


class LockLostError(ValueError):
    """This job no longer holds its ``--save`` lock: it must write nothing more there (a
    ValueError: the run exits 2 with the message, as a lock refused at start does)."""


def lease_seconds() -> float:
    """The lease of a lock taken now: ``ODC_PP_LOCK_LEASE_S`` or :data:`LEASE_S`."""
    text = os.environ.get("ODC_PP_LOCK_LEASE_S")
    if not text:
        return LEASE_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value != value or value == float("inf"):
        raise ValueError(f"ODC_PP_LOCK_LEASE_S={text!r} is not a number of seconds > 0")
    return value


def host_id() -> str:
    """This host's name in lock files: ``ODC_PP_HOST_ID`` when set, else the host name."""
    return os.environ.get("ODC_PP_HOST_ID") or socket.gethostname()


def attempt() -> list[int]:
    """This start's attempt: ``[SLURM_RESTART_COUNT, TORCHELASTIC_RESTART_COUNT]``
    (a requeue raises the first, an elastic restart the second)."""
    return [int(os.environ.get(name) or 0)
            for name in ("SLURM_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT")]


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
    """:func:`host_id` of the holder's rank 0."""
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
    attempt: list[int] = field(default_factory=lambda: [0, 0])
    """:func:`attempt` of the holder: which start of its job it is."""
    lease_s: float = LEASE_S
    """The holder's lease: it is alive while its heartbeat is younger than this."""
    heartbeat: float = 0.0
    """``time.time()`` of the holder's last refresh."""

    def describe(self) -> str:
        return (f"job {self.job_id} (host {self.host}, pid {self.pid}, torchrun agent pid "
                f"{self.agent_pid}, attempt {'.'.join(map(str, self.attempt))}, since "
                f"{self.since})")


def current_owner(*, host: str | None = None, lease_s: float | None = None) -> LockOwner:
    """The lock content of this process (``host``/``lease_s``: tests' fake hosts)."""
    pid = os.getpid()
    return LockOwner(job_id=job_id(), host=host or host_id(), pid=pid,
                     start_ticks=_start_ticks(pid), agent_pid=os.getppid(),
                     token=secrets.token_hex(4),
                     since=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                     attempt=attempt(), lease_s=lease_s or lease_seconds(),
                     heartbeat=_now())


def _read(path: str) -> tuple[LockOwner | None, str | None]:
    """The owner recorded in ``path`` and its identity (the token, or the inode of an
    unreadable file); ``(None, None)`` when there is no such file."""
    try:
        with open(path) as handle:
            ident = f"ino{os.fstat(handle.fileno()).st_ino}"
            text = handle.read()
            mtime = os.fstat(handle.fileno()).st_mtime
    except FileNotFoundError:
        return None, None
    except OSError:
        return None, "unreadable"
    try:
        data = json.loads(text)
        owner = LockOwner(**{key: data[key] for key in LockOwner.__dataclass_fields__
                             if key in data})
    except (ValueError, TypeError, AttributeError):
        return None, ident
    if "heartbeat" not in data:  # written by an older odc-pp: its mtime is the heartbeat
        owner = replace(owner, heartbeat=mtime)
    return owner, owner.token


def _write_tmp(path: str, owner: LockOwner, suffix: str) -> str:
    """A complete, flushed file ``path.TOKEN.SUFFIX`` holding ``owner``."""
    tmp = f"{path}.{owner.token}.{suffix}"
    with open(tmp, "w") as handle:
        json.dump(asdict(owner), handle)
        handle.flush()
        os.fsync(handle.fileno())
    return tmp


def _link_new(path: str, owner: LockOwner) -> bool:
    """Create ``path`` holding ``owner``, atomically and complete; False when it exists."""
    tmp = _write_tmp(path, owner, "new")
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        os.remove(tmp)


def _replace(path: str, owner: LockOwner) -> None:
    os.replace(_write_tmp(path, owner, "swap"), path)


def _takeover_path(path: str, ident: str) -> str:
    return f"{path}.takeover.{ident}"


class SaveLock:
    """The lock of one ``--save`` directory held by this process (rank 0)."""

    def __init__(self, save: str, owner: LockOwner) -> None:
        self.save = save
        self.path = os.path.join(save, LOCK_NAME)
        self.owner = owner
        self.lost = ""
        """Why this process no longer holds the lock (found by the heartbeat), or ''."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._renewing = threading.Lock()  # the heartbeat and a save's check: one claim

    @property
    def token(self) -> str:
        return self.owner.token

    @classmethod
    def acquire(cls, save: str, *, out=None, host: str | None = None,
                lease_s: float | None = None, heartbeat: bool = True) -> "SaveLock":
        """Take the lock of ``save`` (created if missing) or raise ValueError naming the
        live holder (see the module doc); the heartbeat thread runs until
        :meth:`release`."""
        os.makedirs(save, exist_ok=True)
        lock = cls(save, current_owner(host=host, lease_s=lease_s))
        why = lock._take()
        at_failure_exit(lock.release)  # a failed start or run leaves no lock behind
        if why:
            print(f"--save {save}: took over the lock {lock.path}: {why}",
                  file=out or sys.stdout, flush=True)
        if heartbeat:
            lock._thread = threading.Thread(target=lock._beat, daemon=True,
                                            name="odc-pp save lock heartbeat")
            lock._thread.start()
        return lock

    def _take(self) -> str:
        """Create or take over the lock file; '' when created, else why it was taken over."""
        deadline = time.monotonic() + TAKEOVER_WAIT_S
        while True:
            if _link_new(self.path, self.owner):
                return ""
            holder, ident = _read(self.path)
            if ident is None:  # released in between: try again
                continue
            why = self._takeover_reason(holder)  # ValueError while the holder is live
            claim = _takeover_path(self.path, ident)
            if self._claim(claim, holder):
                try:
                    current, now = _read(self.path)
                    if now == ident:  # still that holder: judged again, it may have renewed
                        why = self._takeover_reason(current)  # before our claim
                        _replace(self.path, self.owner)
                        return why
                finally:
                    os.remove(claim)
                continue
            if time.monotonic() > deadline:
                raise ValueError(
                    f"--save {self.save}: another starter has been taking over the lock "
                    f"{self.path} for {TAKEOVER_WAIT_S:g} s ({claim}); if no job is "
                    f"starting on this directory, delete {claim}")
            time.sleep(0.01)  # the winner replaces the lock: then its holder is judged

    def _claim(self, claim: str, holder: LockOwner | None) -> bool:
        """Win the right to replace the stale lock (one starter wins); a claim left by a
        starter that died while holding it is removed after a lease."""
        if _link_new(claim, self.owner):
            return True
        try:
            age = _now() - os.stat(claim).st_mtime
        except FileNotFoundError:
            return False
        if age > (holder.lease_s if holder else LEASE_S):
            try:
                os.remove(claim)
            except FileNotFoundError:
                pass
        return False

    def _takeover_reason(self, holder: LockOwner | None) -> str:
        """Why a held lock may be taken over; ValueError when it may not."""
        if holder is None:
            return "the lock file was unreadable (damaged or written by something else)"
        me = self.owner
        if holder.host == me.host and holder.pid == me.pid:
            return "this process held it already"
        earlier = holder.job_id == me.job_id and not holder.job_id.startswith("pid-") and \
            list(holder.attempt) < list(me.attempt)
        if holder.host == me.host:
            if _alive(holder.pid, holder.start_ticks):
                raise ValueError(
                    f"--save {self.save} is in use by {holder.describe()}: one job per --save "
                    f"directory (a second one would overwrite or prune its checkpoints). Give "
                    f"this job another --save, or stop that job first (lock file {self.path})")
            same = " (an earlier attempt of this job)" if earlier else ""
            return f"its holder {holder.describe()}{same} is no longer running"
        if earlier:
            return f"it was held by an earlier attempt of this job: {holder.describe()}"
        age = _now() - holder.heartbeat
        if age <= holder.lease_s:
            raise ValueError(
                f"--save {self.save} is locked by {holder.describe()} on another host, whose "
                f"heartbeat is {max(age, 0.0):.0f} s old (lease {holder.lease_s:g} s): one job "
                f"per --save directory. Give this job another --save, or stop that job; its "
                f"lock {self.path} expires {holder.lease_s:g} s after its last heartbeat")
        return (f"the lease of {holder.describe()} on another host expired (last heartbeat "
                f"{age:.0f} s ago, lease {holder.lease_s:g} s)")

    def refresh(self) -> bool:
        """Renew the heartbeat; False (and :attr:`lost` says why) when another starter has
        taken the lock over or is taking it over. Once lost, always False.

        The renewal takes the same claim file as a takeover of this holder
        (``.takeover.TOKEN``), so a renewal and a takeover exclude each other: a starter
        that judged this holder stale and claims after the renewal judges it again and finds
        it live; one that claimed first makes the renewal fail."""
        with self._renewing:
            return self._renew()

    def _renew(self) -> bool:
        if self.lost:
            return False
        claim = _takeover_path(self.path, self.token)
        if not _link_new(claim, self.owner):
            self.lost = f"another starter is taking over the lock {self.path} ({claim})"
            return False
        try:
            holder, ident = _read(self.path)
            if ident != self.token:
                self.lost = (f"the lock {self.path} now names "
                             f"{holder.describe() if holder else 'no holder'}")
                return False
            self.owner = replace(self.owner, heartbeat=_now())
            _replace(self.path, self.owner)
            return True
        finally:
            os.remove(claim)

    def check(self) -> None:
        """Before writing into ``--save``: renew the lock, or raise :class:`LockLostError`
        (this job must stop writing there: another job holds the directory now)."""
        if not self.refresh():
            raise LockLostError(
                f"--save {self.save}: this job lost its lock ({self.lost}), so it stops "
                f"without writing more into the directory (a job whose heartbeat stops for "
                f"longer than its lease, {self.owner.lease_s:g} s, e.g. while the process is "
                f"stopped or suspended, may be taken over by another job)")

    def _beat(self) -> None:
        while not self._stop.wait(self.owner.lease_s / 4):
            try:
                if self.refresh():
                    continue
            except OSError as exc:
                self.lost = f"cannot refresh the lock {self.path}: {exc}"
            print(f"--save {self.save}: this job lost its lock: {self.lost}; its lease had "
                  f"expired (no heartbeat for {self.owner.lease_s:g} s). It writes nothing "
                  f"more there: its next checkpoint stops it", file=sys.stderr, flush=True)
            return

    def release(self) -> None:
        """Stop the heartbeat; remove the lock file if this process still holds it."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        if _read(self.path)[1] == self.token:
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
    """Another rank's view of rank 0's lock: the token, never refreshed or released from
    here."""

    def release(self) -> None:
        return None
