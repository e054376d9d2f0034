"""Cross-host path of the ODC transport: get, put and accumulate over torch.distributed
point-to-point (a private gloo group), answered by a per-rank server thread that plays the
parameter server for the shards this rank owns.

Every rank's server thread waits for request headers from any source on ``REQUEST_TAG``.
Each request carries a tag base unique to the requesting client (over all its threads);
the messages of that request use ``base + kind`` with the kind of message in the low bits
(get reply, put/accumulate payload, put/accumulate ack). Kinds keep the two directions of
a pair apart: A -> B carries both payloads whose tags A chose and replies whose tags B
chose, and the two counters are independent, so without the kind bits B's server could
take a reply meant for B's client (a gloo size mismatch, or silently wrong data when
sizes agree).
Within one kind, (source, tag) names exactly one message. A put or accumulate is
acknowledged after it has been applied, so a client that has its acks has landed all its
writes; ``sync`` then only needs a barrier (through the store, naming late peers).

:class:`CrossHostPath` is the transport path over this link (see the contract in
:mod:`odc_pp.odc.transport_path`); its ``peers`` are the members on other hosts.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Callable, Iterator

import torch
import torch.distributed as dist

from odc_pp import _C
from odc_pp.odc.transport_host import Locator, drain, dtype_code, wait_all
from odc_pp.odc.transport_path import Work, peer_order, shard_range

__all__ = ["CrossHostLink", "CrossHostPath"]

REQUEST_TAG = 1
DETERMINISTIC_TAG = 2  # uses tags 2, 3, 4
_FIRST_REPLY_TAG = 16
# low bits of a request's tags: which message of the request (see the module docstring)
_KIND_GET_REPLY, _KIND_PAYLOAD, _KIND_ACK, _KINDS = 0, 1, 2, 4
_TAG_BASES = 1 << 28  # tags stay below 2**30 + _FIRST_REPLY_TAG (gloo takes int32)
_OP_GET, _OP_ACCUMULATE, _OP_STOP, _OP_PUT = 1, 2, 3, 4
_HEADER_LEN = 8

# (alloc_id, byte_offset, nbytes) -> uint8 view of this rank's memory
Resolver = Callable[[int, int, int], torch.Tensor]
# (alloc_id, byte_offset, source uint8 tensor, dtype code, count): add into own memory
Accumulator = Callable[[int, int, torch.Tensor, int, int], None]


class CrossHostLink:
    """Point-to-point link of one rank to every other member of an ODC group."""

    def __init__(self, *, rank: int, world_size: int, global_ranks: list[int], uid: str,
                 timeout_s: float, resolve: Resolver, accumulate: Accumulator):
        self.rank = rank
        self.world_size = world_size
        self.global_ranks = global_ranks
        self.timeout_s = timeout_s
        self._resolve = resolve
        self._accumulate = accumulate
        self._timeout = timedelta(seconds=timeout_s)
        self._store = dist.PrefixStore(f"odcpp/{uid}/",
                                       dist.distributed_c10d._get_default_store())
        self._pg = dist.ProcessGroupGloo(self._store, rank, world_size, self._timeout)
        self._tags = itertools.count()
        self._tag_lock = threading.Lock()
        self.server_error: BaseException | None = None
        self._server = threading.Thread(target=self._serve, name=f"odcpp-server-{rank}",
                                        daemon=True)
        self._server.start()

    # ------------------------------------------------------------------ helpers
    def describe(self, peer: int) -> str:
        return f"peer group rank {peer} (global rank {self.global_ranks[peer]})"

    def _next_tag(self) -> int:
        """Base of a new request's tags: unique among this client's outstanding requests."""
        with self._tag_lock:
            return (next(self._tags) % _TAG_BASES) * _KINDS + _FIRST_REPLY_TAG

    def _peer_error(self, peer: int, what: str, error: BaseException) -> Exception:
        return _C.PeerError(f"odc transport (cross-host): rank {self.rank} got no answer from "
                            f"{self.describe(peer)} for {what} within {self.timeout_s} s: {error}")

    def _wait(self, work, peer: int, what: str) -> None:
        try:
            work.wait(self._timeout)
        except Exception as error:  # gloo reports timeouts and closed peers alike
            raise self._peer_error(peer, what, error) from error

    def _header(self, op: int, alloc_id: int, offset: int, nbytes: int, dtype: int,
                count: int, tag: int) -> torch.Tensor:
        return torch.tensor([op, self.rank, alloc_id, offset, nbytes, dtype, count, tag],
                            dtype=torch.int64)

    # ------------------------------------------------------------------ client
    @contextlib.contextmanager
    def _exchange(self, owner: int, what: str) -> Iterator[None]:
        """Turn a failed send/receive with owner into a PeerError naming it."""
        try:
            yield
        except _C.PeerError:
            raise
        except Exception as error:  # gloo raises at enqueue when the peer's socket closed
            raise self._peer_error(owner, what, error) from error

    def get(self, owner: int, alloc_id: int, offset: int, out: torch.Tensor) -> None:
        """Read owner's bytes [offset, offset + out.numel()) of allocation alloc_id."""
        with self._exchange(owner, "a get"):
            tag = self._next_tag()
            reply = self._pg.recv([out], owner, tag + _KIND_GET_REPLY)
            header = self._header(_OP_GET, alloc_id, offset, out.numel(), 0, 0, tag)
            request = self._pg.send([header], owner, REQUEST_TAG)
            self._wait(request, owner, "a get request")
            self._wait(reply, owner, "a get reply")

    def accumulate(self, owner: int, alloc_id: int, offset: int, payload: torch.Tensor,
                   dtype: int, count: int) -> None:
        """owner's fp32 memory at offset += payload (raw bytes of `count` dtype values)."""
        self._write(_OP_ACCUMULATE, owner, alloc_id, offset, payload, dtype, count,
                    "an accumulate")

    def put(self, owner: int, alloc_id: int, offset: int, payload: torch.Tensor) -> None:
        """owner's bytes [offset, offset + payload.numel()) of allocation alloc_id = payload."""
        self._write(_OP_PUT, owner, alloc_id, offset, payload, 0, payload.numel(), "a put")

    def _write(self, op: int, owner: int, alloc_id: int, offset: int, payload: torch.Tensor,
               dtype: int, count: int, what: str) -> None:
        """Send a request + payload; return once the owner acknowledged applying it."""
        with self._exchange(owner, what):
            tag = self._next_tag()
            ack = torch.zeros(1, dtype=torch.int64)
            ack_work = self._pg.recv([ack], owner, tag + _KIND_ACK)
            header = self._header(op, alloc_id, offset, payload.numel(), dtype, count, tag)
            request = self._pg.send([header], owner, REQUEST_TAG)
            data = self._pg.send([payload], owner, tag + _KIND_PAYLOAD)
            self._wait(request, owner, f"{what} request")
            self._wait(data, owner, f"{what} payload")
            self._wait(ack_work, owner, f"{what} acknowledgement")
        if int(ack.item()) != 1:
            raise _C.PeerError(f"odc transport (cross-host): {self.describe(owner)} failed "
                               f"to apply {what} from rank {self.rank}")

    def barrier(self, epoch: int) -> None:
        """Store barrier; the error names every peer that did not arrive in time."""
        self._store.set(f"sync/{epoch}/{self.rank}", "1")
        deadline = time.monotonic() + self.timeout_s
        waiting = [p for p in range(self.world_size) if p != self.rank]
        while waiting:
            waiting = [p for p in waiting if not self._store.check([f"sync/{epoch}/{p}"])]
            if not waiting:
                break
            if time.monotonic() > deadline:
                names = "; ".join(self.describe(p) for p in waiting)
                raise _C.PeerError(f"odc transport (cross-host): rank {self.rank} timed out "
                                   f"after {self.timeout_s} s in sync {epoch}; not arrived: {names}")
            time.sleep(0.001)
        if epoch > 2:
            self._store.delete_key(f"sync/{epoch - 2}/{self.rank}")

    def exchange_ordered(self, outgoing: dict[int, tuple[torch.Tensor, torch.Tensor]],
                         apply: Callable[[int, torch.Tensor, torch.Tensor], None]) -> None:
        """Deterministic mode: send outgoing[owner] = (meta int64, data fp32) to every other
        rank, then receive and apply(source, meta, data) in source rank order."""
        sends = []
        for owner in range(self.world_size):
            if owner == self.rank:
                continue
            meta, data = outgoing[owner]
            sizes = torch.tensor([meta.numel(), data.numel()], dtype=torch.int64)
            sends += [(owner, self._pg.send([sizes], owner, DETERMINISTIC_TAG)),
                      (owner, self._pg.send([meta], owner, DETERMINISTIC_TAG + 1)),
                      (owner, self._pg.send([data], owner, DETERMINISTIC_TAG + 2))]
        for source in range(self.world_size):
            if source == self.rank:
                apply(source, *outgoing[source])
                continue
            sizes = torch.zeros(2, dtype=torch.int64)
            self._wait(self._pg.recv([sizes], source, DETERMINISTIC_TAG), source, "sync sizes")
            meta = torch.empty(int(sizes[0]), dtype=torch.int64)
            data = torch.empty(int(sizes[1]), dtype=torch.float32)
            self._wait(self._pg.recv([meta], source, DETERMINISTIC_TAG + 1), source, "sync meta")
            self._wait(self._pg.recv([data], source, DETERMINISTIC_TAG + 2), source, "sync data")
            apply(source, meta, data)
        for owner, work in sends:
            self._wait(work, owner, "deterministic sync send")

    def close(self) -> None:
        """Collective: wait for every member, then stop the right neighbour's server."""
        if not self._server.is_alive():
            return
        try:
            self.barrier(-1)
            stop = self._header(_OP_STOP, 0, 0, 0, 0, 0, 0)
            right = (self.rank + 1) % self.world_size
            self._pg.send([stop], right, REQUEST_TAG).wait(self._timeout)
            self._server.join(self.timeout_s)
        except Exception:  # noqa: BLE001 - peers may already be gone; the thread is a daemon
            pass

    # ------------------------------------------------------------------ server
    def _serve(self) -> None:
        header = torch.zeros(_HEADER_LEN, dtype=torch.int64)
        while True:
            try:
                self._pg.recv_anysource([header], REQUEST_TAG).wait()
            except Exception as error:  # noqa: BLE001 - the group is broken: stop serving
                self.server_error = error
                return
            op, source, alloc_id, offset, nbytes, dtype, count, tag = header.tolist()
            if op == _OP_STOP:
                return
            try:
                if op == _OP_GET:
                    data = self._resolve(alloc_id, offset, nbytes)
                    self._pg.send([data], source, tag + _KIND_GET_REPLY).wait(self._timeout)
                elif op in (_OP_ACCUMULATE, _OP_PUT):
                    self._serve_write(op, source, alloc_id, offset, nbytes, dtype, count, tag)
            except Exception as error:  # noqa: BLE001 - one failed client must not stop us
                self.server_error = error

    def _serve_write(self, op, source, alloc_id, offset, nbytes, dtype, count, tag) -> None:
        payload = torch.empty(nbytes, dtype=torch.uint8)
        self._pg.recv([payload], source, tag + _KIND_PAYLOAD).wait(self._timeout)
        status = 1
        try:
            if op == _OP_PUT:
                self._resolve(alloc_id, offset, nbytes).copy_(payload)
            else:
                self._accumulate(alloc_id, offset, payload, dtype, count)
        except Exception as error:  # noqa: BLE001 - reported to the client through the ack
            self.server_error = error
            status = 0
        self._pg.send([torch.tensor([status], dtype=torch.int64)], source,
                      tag + _KIND_ACK).wait(self._timeout)


class CrossHostPath:
    """Members on other hosts (CPU tensors) through a :class:`CrossHostLink`: reads are
    requests answered by the owner's server thread, adds and writes are acknowledged once
    the owner applied them (adds run on one helper thread), the barrier goes through the
    store. Deterministic syncs use :meth:`exchange_ordered` (the owner applies what it
    receives, in source rank order, inside its own sync)."""

    def __init__(self, *, rank: int, world_size: int, global_ranks: list[int], uid: str,
                 timeout_s: float, local: list[bool], locate: Locator, resolve: Resolver,
                 accumulate: Accumulator):
        self.rank = rank
        self.world_size = world_size
        self.peers = peer_order([peer for peer in range(world_size) if not local[peer]],
                                rank, world_size)  # gathers' order
        self.link = CrossHostLink(rank=rank, world_size=world_size, global_ranks=global_ranks,
                                  uid=uid, timeout_s=timeout_s, resolve=resolve,
                                  accumulate=accumulate)
        self._locate = locate
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"odcpp-xacc-{rank}")
        self._pending: list[Work] = []
        self._closed = False

    def gather(self, output: torch.Tensor, shard: torch.Tensor) -> None:
        allocation, offset = self._locate(shard, "shard")
        flat = output.view(-1)
        for peer in self.peers:
            start, end = shard_range(flat.numel(), peer, self.world_size)
            if end > start:
                self.link.get(peer, allocation.alloc_id, offset, flat[start:end].view(torch.uint8))

    def get(self, output: torch.Tensor, remote: torch.Tensor, peer: int) -> None:
        allocation, offset = self._locate(remote, "remote")
        self.link.get(peer, allocation.alloc_id, offset, output.view(-1).view(torch.uint8))

    def put(self, remote: torch.Tensor, input: torch.Tensor, peer: int) -> Work:
        """Complete on return (acknowledged by the owner)."""
        allocation, offset = self._locate(remote, "remote")
        self.link.put(peer, allocation.alloc_id, offset, input.view(-1).view(torch.uint8))
        return Work()

    def scatter_accumulate(self, accumulator: torch.Tensor, input: torch.Tensor) -> Work:
        allocation, offset = self._locate(accumulator, "accumulator")
        work = Work(self._executor.submit(self._scatter_now, allocation.alloc_id, offset,
                                          input))
        self._pending.append(work)
        return work

    def _scatter_now(self, alloc_id: int, offset: int, input: torch.Tensor) -> None:
        flat = input.view(-1)
        code = dtype_code(flat.dtype)
        for step in range(self.world_size):
            peer = (self.rank + 1 + step) % self.world_size  # spread owners over senders
            start, end = shard_range(flat.numel(), peer, self.world_size)
            if end > start and peer in self.peers:
                self.link.accumulate(peer, alloc_id, offset, flat[start:end].view(torch.uint8),
                                     code, end - start)

    def exchange_ordered(self, outgoing: dict[int, tuple[torch.Tensor, torch.Tensor]],
                         apply: Callable[[int, torch.Tensor, torch.Tensor], None]) -> None:
        """See :meth:`CrossHostLink.exchange_ordered` (every member, local ones too)."""
        self.link.exchange_ordered(outgoing, apply)

    def flush(self) -> None:
        pending, self._pending = self._pending, []
        wait_all(pending)

    def barrier(self, epoch: int) -> None:
        self.link.barrier(epoch)

    def close(self) -> None:
        """Collective (stops the server threads)."""
        if self._closed:
            return
        self._closed = True
        pending, self._pending = self._pending, []
        drain(pending)
        self._executor.shutdown(wait=True)
        self.link.close()
