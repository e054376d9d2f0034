"""Which peer stopped responding: every rank's heartbeat in the job's c10d store.

A timed-out wait on a peer says which peer only where the transport knows it (the
pipeline's point-to-point waits, the ODC transport's ``PeerError``); a collective's
timeout (gloo: "Timed out waiting 6000ms for recv operation to complete") does not.
:class:`Heartbeat` answers that question for every kind of wait, at no cost on the hot
path: a daemon thread of each rank writes ``<count> <wall time>`` under its rank in the
store every :attr:`Heartbeat.period_s`. A stopped (SIGSTOP), frozen or dead process stops
writing. When a rank's wait times out, :meth:`Heartbeat.stalled` reads every rank's
heartbeat twice, :attr:`Heartbeat.period_s` x :data:`CONFIRM_PERIODS` apart: the ranks whose
count did not advance stopped responding; :func:`name_stalled_peers` turns the timeout into
one error naming them ("rank 0: ... timed out after 6 s: rank 1 (tp rank 0, cp rank 0,
pp rank 0, dp rank 1) stopped responding (last heartbeat 7.1 s ago)").

The store is the one ``init_process_group`` made (torchrun's, with its restart prefix),
through a connection of the heartbeat's own (``Store.clone``). Its reads at a failure are
bounded: if the store itself does not answer (its host is the stopped rank), the report
says so.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable

__all__ = ["CONFIRM_PERIODS", "Heartbeat", "Stalled", "active_heartbeat", "is_timeout",
           "name_stalled_peers", "rank_words", "start_heartbeat"]

CONFIRM_PERIODS = 2.5
"""How many heartbeat periods apart the two reads of :meth:`Heartbeat.stalled` are: a
live rank writes at least twice in between, whatever the phase of its thread."""

_PREFIX = "odc-pp/heartbeat/"
_ACTIVE: list["Heartbeat"] = []


class Stalled:
    """One rank whose heartbeat did not advance (``age_s``: seconds since its last one by
    this rank's clock; None: it never wrote one)."""

    def __init__(self, rank: int, age_s: float | None) -> None:
        self.rank = rank
        self.age_s = age_s

    def __repr__(self) -> str:
        return f"Stalled(rank={self.rank}, age_s={self.age_s})"


class Heartbeat:
    """This rank's heartbeat thread and the reading of every rank's (see the module).

    ``store``: the job's c10d store (its keys are prefixed here); ``describe(rank)``: how
    a rank is named in reports (e.g. its layout coordinates)."""

    def __init__(self, store, *, rank: int, world_size: int, timeout_s: float,
                 describe: Callable[[int], str] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = float(timeout_s)
        self.period_s = min(max(self.timeout_s / 8, 0.2), 5.0)
        """Seconds between two heartbeats: an eighth of the timeout, in [0.2, 5]."""
        self.describe = describe or (lambda r: f"rank {r}")
        self._store = store
        self._clock = clock
        self._count = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def for_process_group(cls, *, timeout_s: float, describe=None) -> "Heartbeat":
        """The heartbeat of this rank of the initialised default process group, on a
        connection of its own to the group's store."""
        import torch.distributed as dist
        from torch.distributed.distributed_c10d import _get_default_store

        store = _get_default_store()
        try:
            store = store.clone()
        except (AttributeError, RuntimeError, NotImplementedError):
            pass  # a store without clone: share the group's connection
        return cls(store, rank=dist.get_rank(), world_size=dist.get_world_size(),
                   timeout_s=timeout_s, describe=describe)

    # ----- writing -----------------------------------------------------------------
    def beat(self) -> None:
        """Write one heartbeat (the thread's step)."""
        self._count += 1
        self._store.set(f"{_PREFIX}{self.rank}", f"{self._count} {self._clock():.3f}")

    def start(self) -> "Heartbeat":
        """Write the first heartbeat now and the others from a daemon thread; this
        heartbeat becomes :func:`active_heartbeat`."""
        self.beat()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="odc-pp-heartbeat")
        self._thread.start()
        _ACTIVE[:] = [self]
        return self

    def stop(self) -> None:
        self._stop.set()
        if self in _ACTIVE:
            _ACTIVE.remove(self)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.beat()
            except Exception:  # noqa: BLE001 - the store is gone: the job is ending
                return

    # ----- reading -----------------------------------------------------------------
    def read(self) -> dict[int, tuple[int, float]]:
        """Every rank's last heartbeat (count, wall time); a rank that never wrote one
        is absent."""
        beats = {}
        for rank in range(self.world_size):
            key = f"{_PREFIX}{rank}"
            if self._store.check([key]):
                count, stamp = self._store.get(key).decode().split()
                beats[rank] = (int(count), float(stamp))
        return beats

    def stalled(self, *, sleep: Callable[[float], None] = time.sleep) -> list[Stalled]:
        """The ranks (other than this one) whose heartbeat did not advance over
        :data:`CONFIRM_PERIODS` periods, lowest first."""
        first = self.read()
        sleep(CONFIRM_PERIODS * self.period_s)
        second = self.read()
        now = self._clock()
        found = []
        for rank in range(self.world_size):
            if rank == self.rank:
                continue
            before, after = first.get(rank), second.get(rank)
            if after is None:
                found.append(Stalled(rank, None))
            elif before is not None and after[0] == before[0]:
                found.append(Stalled(rank, max(0.0, now - after[1])))
        return found

    def report(self, *, limit_s: float | None = None) -> str:
        """Which ranks stopped responding, in words; bounded by ``limit_s`` (default:
        the timeout): a store that does not answer is reported as such."""
        limit_s = self.timeout_s if limit_s is None else limit_s
        answer: list = []

        def ask() -> None:
            try:
                answer.append(self.stalled())
            except Exception as error:  # noqa: BLE001 - reported below
                answer.append(error)

        thread = threading.Thread(target=ask, daemon=True, name="odc-pp-heartbeat-read")
        thread.start()
        thread.join(limit_s + CONFIRM_PERIODS * self.period_s)
        if not answer:
            return (f"the store holding the heartbeats did not answer within {limit_s:g} s "
                    "(its host, torchrun's agent or rank 0, stopped responding)")
        if isinstance(answer[0], Exception):
            return f"the heartbeats could not be read ({type(answer[0]).__name__}: " \
                   f"{answer[0]})"
        if not answer[0]:
            return ("every other rank's heartbeat is current: no rank stopped; one waits "
                    "in another operation (a collective called in a different order?) or "
                    "is slower than the timeout")
        return "; ".join(self._words(stalled) for stalled in answer[0])

    def _words(self, stalled: Stalled) -> str:
        last = ("never sent a heartbeat" if stalled.age_s is None
                else f"last heartbeat {stalled.age_s:.1f} s ago")
        return f"{self.describe(stalled.rank)} stopped responding ({last})"


def rank_words(layout, rank: int) -> str:
    """``rank`` with its place in ``layout`` (a ParallelLayout): "rank 1 (pp rank 0, dp
    rank 1)", with its tp and cp ranks where those are parallel."""
    tp_rank, cp_rank, pp_rank, dp_rank = layout.coordinates(rank)
    parts = [f"tp rank {tp_rank}"] if layout.tp > 1 else []
    parts += [f"cp rank {cp_rank}"] if layout.cp > 1 else []
    parts += [f"pp rank {pp_rank}", f"dp rank {dp_rank}"]
    return f"rank {rank} ({', '.join(parts)})"


def start_heartbeat(layout, *, timeout_s: float) -> Heartbeat:
    """Start this rank's heartbeat in the default process group's store, naming ranks by
    their place in ``layout`` (collective in effect: every rank of a job starts one)."""
    return Heartbeat.for_process_group(timeout_s=timeout_s,
                                       describe=lambda rank: rank_words(layout, rank)).start()


def active_heartbeat() -> Heartbeat | None:
    """The heartbeat this process started last (None: none runs)."""
    return _ACTIVE[0] if _ACTIVE else None


_TIMEOUT_MARKERS = ("timed out", "operation timeout", "no answer from",
                    "did not complete within", "not finished after")


def is_timeout(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is a wait on peers that timed
    out: a TimeoutError (the pipeline's waits), or a transport's error saying so (gloo's
    "Timed out waiting", the ODC transport's ``PeerError``, NCCL's watchdog)."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, TimeoutError):
            return True
        if any(marker in str(exc).lower() for marker in _TIMEOUT_MARKERS):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def _where(exc: BaseException) -> str:
    """The innermost odc-pp frame of ``exc``'s traceback ("function (file:line)")."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if "/odc_pp/" in frame.filename.replace("\\", "/"):
            name = frame.filename.replace("\\", "/").split("/odc_pp/", 1)[1]
            return f" in {frame.name} (odc_pp/{name}:{frame.lineno})"
    return ""


def name_stalled_peers(exc: BaseException, *, rank: int,
                       heartbeat: Heartbeat | None = None) -> BaseException:
    """``exc`` itself unless it is a timeout (:func:`is_timeout`) and a heartbeat runs;
    then a TimeoutError (raised from ``exc``) naming the ranks that stopped responding:
    "rank 0: <what> timed out after 6 s<where>: rank 1 (...) stopped responding (...)".
    Blocks for up to about the timeout (:meth:`Heartbeat.report`)."""
    heartbeat = heartbeat if heartbeat is not None else active_heartbeat()
    if heartbeat is None or not is_timeout(exc):
        return exc
    first_line = (str(exc).strip().splitlines() or [""])[0]
    what = f"{type(exc).__name__}: {first_line}" if first_line else type(exc).__name__
    named = TimeoutError(f"rank {rank}: a wait on peers timed out after "
                         f"{heartbeat.timeout_s:g} s{_where(exc)}: {heartbeat.report()} "
                         f"[{what}]")
    named.__cause__ = exc
    named.__traceback__ = exc.__traceback__
    return named
