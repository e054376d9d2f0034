"""Point-to-point transfer of activations and gradients.

By default the receiver derives each message's shape from the microbatch (chunks
implementing ``input_shape``/``output_shape``), so only the payload travels and its
``irecv`` is posted when the schedule's RECV runs. Otherwise every message is a small
header (dtype, ndim, shape) followed by the payload: senders post both at once, receivers
post the header ``irecv`` at the RECV and the payload ``irecv`` once the header arrived.
Per peer, receives keep the sender's order on the wire (header k, payload k, header k+1,
...), so backends that ignore tags (NCCL) match the same way gloo does with tags.

Every message ``src -> dst`` travels on the channel :class:`PipelineChannels` gives that
direction (one process group per direction by default, see
:mod:`odc_pp.runtime.p2p_channels`): its headers, payloads, single and batched sends.
Several sends issued together go through one ``batch_isend_irecv`` per channel (it takes
one group). Every wait has a deadline. On a device (NCCL) a wait is stream-ordered:
``work.wait()`` makes the current stream wait for the transfer and returns at once, so
the host queues the consumer's kernels ahead, and a :class:`Watchdog` thread enforces the
deadline (it checks ``is_completed()`` off the critical path; an overdue transfer is
raised at the rank's next transport call, or ends the process if the host stays stuck).
gloo's CPU works only complete inside ``wait``, which honours its timeout. The
TimeoutError names this rank, the peer and the action. The calls go through a
:class:`TorchP2POps` (or a test backend with the same methods).
"""

from __future__ import annotations

import datetime
import os
import sys
import threading
import time
from collections import deque

import torch
import torch.distributed as dist

from .liveness import active_heartbeat
from .p2p_channels import PipelineChannels, channel_key

__all__ = ["PeerTransport", "PendingMessage", "TorchP2POps", "Watchdog"]

_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64]
_HEADER_LEN = 10  # dtype code, ndim, up to 8 dims


def _encode_header(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    if tensor.dim() > _HEADER_LEN - 2:
        raise ValueError(f"cannot send a {tensor.dim()}-d tensor (at most {_HEADER_LEN - 2})")
    header = [_DTYPES.index(tensor.dtype), tensor.dim(), *tensor.shape]
    header += [0] * (_HEADER_LEN - len(header))
    return torch.tensor(header, dtype=torch.int64, device=device)


def _decode_header(header: torch.Tensor) -> tuple[torch.dtype, list[int]]:
    values = header.tolist()
    return _DTYPES[values[0]], values[2:2 + values[1]]


class PendingMessage:
    """One expected message from one peer; :meth:`PeerTransport.wait` yields its tensor."""

    def __init__(self, peer: int, tag: int, what: str) -> None:
        self.peer = peer
        self.tag = tag
        self.what = what
        self.header: torch.Tensor | None = None
        self.header_work = None
        self.payload: torch.Tensor | None = None
        self.payload_work = None


class TorchP2POps:
    """torch.distributed's point-to-point calls (``peer`` is a global rank). ``device``:
    where the tensors live; CPU tensors go through gloo, whose works complete only inside
    ``wait`` (never by themselves for ``is_completed``), so they are waited with gloo's
    own timeout; device works (NCCL) are waited stream-ordered under a
    :class:`Watchdog`."""

    def __init__(self, device: torch.device, *, watchdog: "Watchdog | None" = None) -> None:
        self.device = torch.device(device)
        self.host_blocking = self.device.type == "cpu"
        self.watchdog = watchdog if watchdog is not None else Watchdog()

    def isend(self, tensor: torch.Tensor, peer: int, group, tag: int):
        if self.host_blocking:
            return dist.isend(tensor, peer, group=group, tag=tag)
        return self.batch_isend([(tensor, peer, group, tag)])[0]

    def irecv(self, tensor: torch.Tensor, peer: int, group, tag: int):
        if self.host_blocking:
            return dist.irecv(tensor, peer, group=group, tag=tag)
        # NCCL runs single ops on a pair communicator and batches on the group's main
        # one (they never match): on device every op goes through a batch, so all ops
        # of a channel share its one communicator and stream
        return dist.batch_isend_irecv([dist.P2POp(dist.irecv, tensor, peer, group, tag)])[0]

    def batch_isend(self, sends: list[tuple[torch.Tensor, int, object, int]]) -> list:
        """Sends of one group issued together."""
        return dist.batch_isend_irecv([dist.P2POp(dist.isend, tensor, peer, group, tag)
                                       for tensor, peer, group, tag in sends])

    def completed(self, work) -> bool:
        """Whether ``work`` is known complete without blocking: device works answer
        ``is_completed()``; gloo's CPU works never do before their ``wait``."""
        return not self.host_blocking and work.is_completed()

    def touch(self, group):
        """The warm-up's first operation on ``group`` (:mod:`odc_pp.runtime.warmup`): a
        one-element all-reduce, on NCCL the group's main communicator."""
        return dist.all_reduce(torch.zeros(1, device=self.device), group=group,
                               async_op=True)

    def wait(self, work, timeout_s: float, what: str = "", *, block_host: bool = False
             ) -> bool:
        """Wait until ``work`` completed or ``timeout_s`` passed (False then). On a
        device: stream-ordered, the deadline goes to the watchdog (``what`` names the
        transfer in its TimeoutError) and the call returns True at once; ``block_host``
        (start-up only, e.g. the warm-up) waits on the host, checking ``is_completed``."""
        if block_host and not self.host_blocking:
            deadline = time.monotonic() + timeout_s
            while not work.is_completed():
                if time.monotonic() >= deadline:
                    return False
                time.sleep(1e-3)
            work.wait()
            return True
        if not self.host_blocking:
            self.watchdog.watch(work, timeout_s, what or "a point-to-point transfer")
            work.wait()  # the current stream waits; the host goes on
            return True
        try:
            return work.wait(timeout=datetime.timedelta(seconds=timeout_s)) is not False
        except RuntimeError as error:
            if "timed out" in str(error).lower() or "timeout" in str(error).lower():
                return False
            raise


class Watchdog:
    """Deadlines of stream-ordered waits. :meth:`watch` registers a work with its
    deadline; a daemon thread (started at the first watch) checks the pending works
    every ``period_s`` with ``is_completed()`` and drops finished ones. The first overdue
    one becomes :attr:`error`, a TimeoutError naming the transfer: it is raised by the
    next :meth:`watch` or :meth:`raise_if_expired` on the rank's main thread; if none
    comes within ``grace_s`` (the host is stuck, e.g. synchronizing on the stream that
    waits for the transfer), ``on_expired`` runs -- by default it writes the error to
    stderr and ends the process with status 1, as NCCL's own watchdog would."""

    def __init__(self, *, period_s: float = 0.1, grace_s: float = 30.0,
                 on_expired=None) -> None:
        self.period_s = period_s
        self.grace_s = grace_s
        self.on_expired = on_expired if on_expired is not None else _end_process
        self.error: TimeoutError | None = None
        self._raised = False
        self._pending: list[tuple[object, float, float, str]] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def watch(self, work, timeout_s: float, what: str) -> None:
        self.raise_if_expired()
        with self._lock:
            self._pending.append((work, time.monotonic() + timeout_s, timeout_s, what))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="odc-pp-p2p-watchdog")
                self._thread.start()

    def raise_if_expired(self) -> None:
        if self.error is not None:
            self._raised = True
            raise self.error

    def check(self, now: float) -> TimeoutError | None:
        """Drop completed works; record and return the error of the first overdue one."""
        with self._lock:
            self._pending = [item for item in self._pending if not item[0].is_completed()]
            for _, deadline, timeout_s, what in self._pending:
                if now >= deadline and self.error is None:
                    self.error = TimeoutError(f"{what} did not complete within "
                                              f"{timeout_s:g}s")
        return self.error

    def pending_count(self) -> int:
        with self._lock:
            return len(self._pending)

    def _run(self) -> None:
        while self.check(time.monotonic()) is None:
            time.sleep(self.period_s)
        deadline = time.monotonic() + self.grace_s
        while not self._raised and time.monotonic() < deadline:
            time.sleep(self.period_s)
        if not self._raised:
            self.on_expired(self.error)


def _end_process(error: BaseException) -> None:
    heartbeat = active_heartbeat()
    stalled = f" ({heartbeat.report()})" if heartbeat is not None else ""
    print(f"odc-pp watchdog: {error}{stalled}; the host did not return to the pipeline "
          "within the grace period, ending the process", file=sys.stderr, flush=True)
    os._exit(1)


class PeerTransport:
    """Sends and receives of pipeline rank ``rank`` over ``channels``."""

    def __init__(self, *, channels: PipelineChannels, rank: int, device: torch.device,
                 timeout_s: float, batch: bool = True, ops=None) -> None:
        self.channels = channels
        self.device = device
        self.timeout_s = float(timeout_s)
        self.batch = batch
        self.rank = rank
        self.ops = ops if ops is not None else TorchP2POps(device)
        self._unposted: dict[int, deque[PendingMessage]] = {}
        self._inflight_sends: list[tuple[object, list[torch.Tensor], object, str]] = []
        self.receives_preposted = False
        """Every peer posts all receives of a minibatch before its first send of it (the
        runtime's prepost_receives, equal on all ranks): once a message from a peer
        arrived, waiting for a send to it cannot block on the peer's progress."""
        self._heard_from: set[int] = set()
        self.max_inflight_sends = 0
        """Most sent tensors held at once since :meth:`drain_sends` (memory accounting)."""
        self.waited_s = 0.0
        """Total seconds spent blocked in waits (for timing actions without their waits)."""

    # ----- sending ---------------------------------------------------------------
    def send_many(self, messages: list[tuple[torch.Tensor, int, int, str]], *,
                  with_header: bool = True) -> None:
        """Post sends of (tensor, peer, tag, what), batched per channel; completion is
        checked in :meth:`drain_sends`. ``with_header=False``: the receiver knows the
        shape."""
        per_channel: dict[tuple, tuple[list, list[int], list[str]]] = {}
        for tensor, peer, tag, what in messages:
            tensor = tensor.contiguous()
            group = self.channels.group(self.rank, peer)
            peer_global = self.channels.global_rank(peer)
            ops, peers, whats = per_channel.setdefault(
                channel_key(self.channels.layout, self.rank, peer, batched=True), ([], [], []))
            if with_header:
                ops.append((_encode_header(tensor, self.device), peer_global, group, 2 * tag))
            ops.append((tensor, peer_global, group, 2 * tag + 1))
            peers.append(peer)
            whats.append(what)
        for ops, peers, whats in per_channel.values():
            if self.batch and len(ops) > 1:
                works = self.ops.batch_isend(ops)
            else:
                works = [self.ops.isend(*op) for op in ops]
            keep = [op[0] for op in ops]
            peer = peers[0] if len(set(peers)) == 1 else sorted(set(peers))
            for work in works:
                self._inflight_sends.append((work, keep, peer, ", ".join(whats)))
        self.max_inflight_sends = max(self.max_inflight_sends, self.inflight_send_count())

    def reap_sends(self) -> None:
        """Forget the sends that completed, so a sent tensor lives only while in flight
        (memory grows with the pipeline depth, not the microbatch count). Device (NCCL)
        works are polled without blocking. gloo's CPU works report completion only inside
        ``wait`` and a gloo send completes only once the receiver posted its receive, so
        they are waited here only for peers whose receives are known posted (see
        :attr:`receives_preposted`); otherwise they stay until :meth:`drain_sends`."""
        kept = []
        for entry in self._inflight_sends:
            work, _, peer, what = entry
            if self._completed(work):
                continue
            if self.receives_preposted and isinstance(peer, int) and peer in self._heard_from:
                self._wait(work, f"completion of send ({what})", peer)
                continue
            kept.append(entry)
        self._inflight_sends = kept

    def _completed(self, work) -> bool:
        completed = getattr(self.ops, "completed", None)  # test backends may lack it
        return completed(work) if completed is not None else work.is_completed()

    def inflight_send_count(self) -> int:
        """Distinct sent tensors (payloads and headers) still held for their sends."""
        return len({id(t) for _, keep, _, _ in self._inflight_sends for t in keep})

    def drain_sends(self) -> None:
        for work, _, peer, what in self._inflight_sends:
            self._wait(work, f"completion of send ({what})", peer)
        self._inflight_sends.clear()
        self._heard_from.clear()

    # ----- receiving -------------------------------------------------------------
    def post_recv(self, peer: int, tag: int, what: str, *,
                  shape: tuple[torch.Size, torch.dtype] | None = None) -> PendingMessage:
        """Expect a message; with a known ``shape`` (shape, dtype) the payload receive is
        posted at once and no header is expected (the sender must agree)."""
        message = PendingMessage(peer, tag, what)
        if shape is not None:
            message.payload = torch.empty(shape[0], dtype=shape[1], device=self.device)
            message.payload_work = self._irecv(message.payload, peer, 2 * tag + 1)
            return message
        queue = self._unposted.setdefault(peer, deque())
        queue.append(message)
        if len(queue) == 1:
            self._post_header(message)
        return message

    def wait(self, message: PendingMessage) -> torch.Tensor:
        queue = self._unposted.get(message.peer)
        while message.payload_work is None:
            head = queue[0]
            self._wait(head.header_work, f"header of {head.what}", head.peer)
            dtype, shape = _decode_header(head.header)
            head.payload = torch.empty(shape, dtype=dtype, device=self.device)
            head.payload_work = self._irecv(head.payload, head.peer, 2 * head.tag + 1)
            queue.popleft()
            if queue:
                self._post_header(queue[0])
        self._wait(message.payload_work, message.what, message.peer)
        self._heard_from.add(message.peer)
        return message.payload

    def _irecv(self, tensor: torch.Tensor, peer: int, tag: int):
        return self.ops.irecv(tensor, self.channels.global_rank(peer),
                              self.channels.group(peer, self.rank), tag)

    def _post_header(self, message: PendingMessage) -> None:
        message.header = torch.empty(_HEADER_LEN, dtype=torch.int64, device=self.device)
        message.header_work = self._irecv(message.header, message.peer, 2 * message.tag)

    def _wait(self, work, what: str, peer: int) -> None:
        start = time.perf_counter()
        describe = (f"pipeline rank {self.rank}: {what} (peer: pipeline rank {peer}, "
                    f"global rank {self.channels.global_rank(peer)})")
        try:
            completed = self.ops.wait(work, self.timeout_s, what=describe)
        except RuntimeError as error:
            raise TimeoutError(f"pipeline rank {self.rank}: waiting for {what} (peer: "
                               f"pipeline rank {peer}) failed: {error}") from error
        finally:
            self.waited_s += time.perf_counter() - start
        if not completed:
            raise TimeoutError(f"pipeline rank {self.rank}: {what} did not complete within "
                               f"{self.timeout_s:g}s (peer: pipeline rank {peer}, global "
                               f"rank {self.channels.global_rank(peer)})")
