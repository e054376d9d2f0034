"""Several one-sided ``get``s issued together and waited for once, with the transport's own
timings of the host-side gathers.

:meth:`ManyGets.issue` takes ``(output, remote, peer)`` pieces (e.g. one per owner of a
layer's range, :func:`odc_pp.odc.residency.gather_segment`) and issues every piece before
anything waits:

* CUDA (odc backend): every copy is queued on its owner's gather stream, each stream first
  waiting for the work queued so far on the current (compute) stream; the returned Work's
  ``wait()`` makes the then current stream wait for all of them (no host block).
* CPU, ``async_op``: the copies run on the transport's helper thread (one per group), so
  the caller computes meanwhile; ``wait()`` blocks until they are done, or copies them
  itself if the helper thread has not started them (a busy host's thread wake-up can
  take longer than the copy).
* CPU, blocking: the copies run on the calling thread before ``issue`` returns.

:class:`GatherTimings` records, per CPU gather, how long its copies took (``busy_s``, on
whichever thread ran them) and how long the calling thread was blocked for it
(``exposed_s``: the whole copy when blocking; the ``wait()`` when issued ahead). Their
ratio is the exposed share of the gather time that prefetching is meant to drive to 0.
CUDA gathers are not timed here (the host never blocks on them; measure step time).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from odc_pp.odc.transport_path import Work

__all__ = ["GatherRecord", "GatherTimings", "ManyGets"]


@dataclass(kw_only=True)
class GatherRecord:
    """One gather of several pieces."""

    nbytes: int
    """Bytes read."""
    ahead: bool
    """Issued ahead of its use (on the helper thread)."""
    busy_s: float = 0.0
    """Seconds its copies took, issue to completion."""
    exposed_s: float = 0.0
    """Seconds the calling thread was blocked for it."""


class GatherTimings:
    """The CPU gathers of one group since the last :meth:`reset`, the most recent
    :attr:`KEPT` of them (a long run resets nothing; thread-safe)."""

    KEPT = 10_000

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.records: deque[GatherRecord] = deque(maxlen=self.KEPT)

    def add(self, record: GatherRecord) -> GatherRecord:
        with self._lock:
            self.records.append(record)
        return record

    def reset(self) -> list[GatherRecord]:
        """Forget the records; returns them."""
        with self._lock:
            records, self.records = list(self.records), deque(maxlen=self.KEPT)
        return records

    def totals(self) -> tuple[float, float]:
        """``(busy_s, exposed_s)`` summed over the records."""
        with self._lock:
            return (sum(r.busy_s for r in self.records),
                    sum(r.exposed_s for r in self.records))


class ManyGets:
    """The multi-piece gets of one :class:`~odc_pp.odc.transport_group.OdcGroup`."""

    def __init__(self, group) -> None:
        self._group = group
        self._executor: ThreadPoolExecutor | None = None
        self.timings = GatherTimings()

    def issue(self, pieces: list[tuple[torch.Tensor, torch.Tensor, int]], *,
              async_op: bool = False) -> Work:
        """Read every ``(output, remote, peer)`` piece (module docstring). Do not touch the
        outputs before the returned Work's ``wait()``."""
        if not pieces:
            return Work()
        group = self._group
        if pieces[0][0].is_cuda and group.collective is None:
            work = group.cuda_path().get_many(pieces)
            if not async_op:
                work.wait()
            return work
        record = self.timings.add(GatherRecord(
            nbytes=sum(out.numel() * out.element_size() for out, _, _ in pieces),
            ahead=async_op))
        if not async_op:
            self._copy(pieces, record)
            record.exposed_s = record.busy_s
            return Work()
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"odcpp-get-{group.rank}")
        future = self._executor.submit(self._copy, pieces, record)
        return Work(waiter=lambda timeout: self._wait(future, pieces, record, timeout))

    def _copy(self, pieces, record: GatherRecord) -> None:
        start = time.perf_counter()
        for output, remote, peer in pieces:
            self._group.get(output, remote, peer)
        record.busy_s = time.perf_counter() - start

    def _wait(self, future: Future, pieces, record: GatherRecord,
              timeout: float | None) -> None:
        start = time.perf_counter()
        if future.cancel():  # the helper thread has not started it: copy here, not wait
            try:
                self._copy(pieces, record)
            finally:
                record.exposed_s = time.perf_counter() - start
            return
        try:
            # the paths' own waits time out and name the peer; this bounds the thread
            future.result(timeout=2 * self._group.config.timeout_s if timeout is None
                          else timeout)
        finally:
            record.exposed_s = time.perf_counter() - start

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
