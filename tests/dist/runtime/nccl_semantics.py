"""A CPU point-to-point backend with NCCL's ordering semantics, for tests.

gloo matches messages by tag; NCCL runs the operations of one communicator in issue order
on one stream. :class:`NcclSemanticsOps` has the methods ``PeerTransport`` calls
(``isend``, ``irecv``, ``batch_isend``, ``wait``) and executes them like NCCL would:

* a communicator is keyed like torch's NCCL backend keys it: single operations of a group
  go to the communicator of their (unordered) rank pair, ``batch_isend`` to the group's
  main one;
* per communicator, one worker thread runs the operations strictly in issue order (a
  batch as one unit) over gloo, so a receive blocks everything queued behind it;
* a send completes only after the receiver's matching receive finished: the receiver
  acknowledges every message over a separate gloo group (NCCL's rendezvous, taken
  conservatively);
* works answer ``is_completed()`` without blocking and are waited by polling against the
  deadline, as the transport does on NCCL.

Construction is collective over the default group (it creates the acknowledgement groups).
A rank whose worker is stuck in a deadlock is reported by the transport's TimeoutError;
the worker threads are daemons and stay blocked until the process ends.
"""

from __future__ import annotations

import datetime
import queue
import threading

import torch
import torch.distributed as dist

from odc_pp.runtime.p2p import poll
from odc_pp.runtime.p2p_channels import ChannelLayout, PipelineChannels, neighbour_pairs

__all__ = ["NcclSemanticsOps"]

_WORKER_TIMEOUT = datetime.timedelta(minutes=10)


class _Work:
    def __init__(self) -> None:
        self._done = threading.Event()
        self.error: BaseException | None = None

    def is_completed(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout=None) -> bool:
        self._done.wait()
        if self.error is not None:
            raise RuntimeError(f"NCCL-semantics operation failed: {self.error}")
        return True

    def finish(self, error: BaseException | None = None) -> None:
        self.error = error
        self._done.set()


class NcclSemanticsOps:
    """NCCL-ordered point-to-point calls over the groups of ``channels`` (one pipeline
    spanning the default group)."""

    def __init__(self, channels: PipelineChannels) -> None:
        self._ack: dict[object, object] = {}
        if channels.layout is ChannelLayout.SHARED:
            pairs = [(channels.shared_group, channels.ranks)]
        else:
            pairs = [(channels.groups[pair], sorted(channels.ranks[r] for r in pair))
                     for pair in neighbour_pairs(len(channels.ranks))]
        for group, ranks in pairs:  # same order on every rank: collective
            self._ack[group] = dist.new_group(ranks)
        self._me = dist.get_rank()
        self._fifos: dict[tuple, queue.Queue] = {}
        self._lock = threading.Lock()

    # ----- the ops interface ---------------------------------------------------
    def isend(self, tensor: torch.Tensor, peer: int, group, tag: int):
        return self._issue(("pair", id(group), min(peer, self._me), max(peer, self._me)),
                           [("send", tensor, peer, group, tag)])

    def irecv(self, tensor: torch.Tensor, peer: int, group, tag: int):
        return self._issue(("pair", id(group), min(peer, self._me), max(peer, self._me)),
                           [("recv", tensor, peer, group, tag)])

    def batch_isend(self, sends: list[tuple[torch.Tensor, int, object, int]]) -> list:
        groups = {id(group) for _, _, group, _ in sends}
        if len(groups) != 1:
            raise ValueError("batch_isend_irecv takes operations of one group")
        work = self._issue(("main", groups.pop()),
                           [("send", tensor, peer, group, tag)
                            for tensor, peer, group, tag in sends])
        return [work]

    def wait(self, work, timeout_s: float) -> bool:
        return poll(work, timeout_s)

    # ----- execution -----------------------------------------------------------
    def _issue(self, key: tuple, ops: list) -> _Work:
        work = _Work()
        with self._lock:
            fifo = self._fifos.get(key)
            if fifo is None:
                fifo = self._fifos[key] = queue.Queue()
                threading.Thread(target=self._run, args=(fifo,), daemon=True,
                                 name=f"nccl-semantics-{key}").start()
        fifo.put((ops, work))
        return work

    def _run(self, fifo: queue.Queue) -> None:
        while True:
            ops, work = fifo.get()
            try:
                self._execute(ops)
            except BaseException as error:  # noqa: BLE001 - handed to the waiter
                work.finish(error)
            else:
                work.finish()

    def _execute(self, ops: list) -> None:
        data = []
        for kind, tensor, peer, group, tag in ops:
            call = dist.isend if kind == "send" else dist.irecv
            data.append(call(tensor, peer, group=group, tag=tag))
        for item in data:
            _wait(item)
        acks = []
        for kind, _, peer, group, tag in ops:  # rendezvous: a send ends when received
            flag = torch.zeros(1)
            call = dist.irecv if kind == "send" else dist.isend
            acks.append((call(flag, peer, group=self._ack[group], tag=tag), flag))
        for item, _ in acks:
            _wait(item)


def _wait(work) -> None:
    """One blocking wait (it releases the GIL, so the rank's other threads run). Never in
    slices: a gloo point-to-point wait that times out closes the connection ("Application
    timeout caused pair closure"), losing the message in flight -- with slices of 50 ms
    every exchange that waited longer than that hung. The transport's deadline on the
    rank's main thread reports a stuck operation; this wait only bounds the worker."""
    work.wait(timeout=_WORKER_TIMEOUT)
