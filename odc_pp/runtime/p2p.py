"""Point-to-point transfer of activations and gradients.

By default the receiver derives each message's shape from the microbatch (chunks
implementing ``input_shape``/``output_shape``), so only the payload travels and its
``irecv`` is posted when the schedule's RECV runs. Otherwise every message is a small
header (dtype, ndim, shape) followed by the payload: senders post both at once, receivers
post the header ``irecv`` at the RECV and the payload ``irecv`` once the header arrived.
Per peer, receives keep the sender's order on the wire (header k, payload k, header k+1,
...), so backends that ignore tags (NCCL) match the same way gloo does with tags.
Several sends issued together go through one ``batch_isend_irecv``. Every wait has a
timeout that names the peer.
"""

from __future__ import annotations

import datetime
import time
from collections import deque

import torch
import torch.distributed as dist

__all__ = ["PeerTransport", "PendingMessage"]

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


class PeerTransport:
    """Sends and receives of one pipeline rank over ``group`` (ranks are group ranks)."""

    def __init__(self, *, group, device: torch.device, timeout_s: float,
                 batch: bool = True) -> None:
        self.group = group
        self.device = device
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.batch = batch
        self.rank = dist.get_rank(group)
        self._unposted: dict[int, deque[PendingMessage]] = {}
        self._inflight_sends: list[tuple[object, list[torch.Tensor], str]] = []
        self.waited_s = 0.0
        """Total seconds spent blocked in waits (for timing actions without their waits)."""

    # ----- sending ---------------------------------------------------------------
    def send_many(self, messages: list[tuple[torch.Tensor, int, int, str]], *,
                  with_header: bool = True) -> None:
        """Post sends of (tensor, peer, tag, what) in one batch; completion is checked in
        :meth:`drain_sends`. ``with_header=False``: the receiver knows the shape."""
        ops, keep = [], []
        for tensor, peer, tag, what in messages:
            tensor = tensor.contiguous()
            peer_global = dist.get_global_rank(self.group, peer)
            if with_header:
                header = _encode_header(tensor, self.device)
                ops.append(dist.P2POp(dist.isend, header, peer_global, self.group, 2 * tag))
                keep.append(header)
            ops.append(dist.P2POp(dist.isend, tensor, peer_global, self.group, 2 * tag + 1))
            keep.append(tensor)
        if not ops:
            return
        what = ", ".join(m[3] for m in messages)
        if self.batch and len(ops) > 1:
            works = dist.batch_isend_irecv(ops)
        else:
            works = [op.op(op.tensor, op.peer, op.group, op.tag) for op in ops]
        for work in works:
            self._inflight_sends.append((work, keep, what))

    def drain_sends(self) -> None:
        for work, _, what in self._inflight_sends:
            self._wait(work, f"completion of send ({what})")
        self._inflight_sends.clear()

    # ----- receiving -------------------------------------------------------------
    def post_recv(self, peer: int, tag: int, what: str, *,
                  shape: tuple[torch.Size, torch.dtype] | None = None) -> PendingMessage:
        """Expect a message; with a known ``shape`` (shape, dtype) the payload receive is
        posted at once and no header is expected (the sender must agree)."""
        message = PendingMessage(peer, tag, what)
        if shape is not None:
            message.payload = torch.empty(shape[0], dtype=shape[1], device=self.device)
            message.payload_work = dist.irecv(message.payload, dist.get_global_rank(
                self.group, peer), self.group, 2 * tag + 1)
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
            self._wait(head.header_work, f"header of {head.what} from pipeline rank {head.peer}")
            dtype, shape = _decode_header(head.header)
            head.payload = torch.empty(shape, dtype=dtype, device=self.device)
            head.payload_work = dist.irecv(head.payload, dist.get_global_rank(
                self.group, head.peer), self.group, 2 * head.tag + 1)
            queue.popleft()
            if queue:
                self._post_header(queue[0])
        self._wait(message.payload_work, f"{message.what} from pipeline rank {message.peer}")
        return message.payload

    def pending_count(self) -> int:
        return sum(len(queue) for queue in self._unposted.values())

    def _post_header(self, message: PendingMessage) -> None:
        message.header = torch.empty(_HEADER_LEN, dtype=torch.int64, device=self.device)
        message.header_work = dist.irecv(message.header, dist.get_global_rank(
            self.group, message.peer), self.group, 2 * message.tag)

    def _wait(self, work, what: str) -> None:
        start = time.perf_counter()
        try:
            completed = work.wait(timeout=self.timeout)
        except RuntimeError as error:
            raise TimeoutError(f"pipeline rank {self.rank}: waiting for {what} failed or "
                               f"timed out after {self.timeout.total_seconds()}s: {error}") \
                from error
        finally:
            self.waited_s += time.perf_counter() - start
        if completed is False:
            raise TimeoutError(f"pipeline rank {self.rank}: {what} did not complete within "
                               f"{self.timeout.total_seconds()}s")
