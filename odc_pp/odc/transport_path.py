"""The contract every transport path of an ODC group keeps, and the types they share.

A *path* moves data between this rank and one kind of peer: same-host CPU memory
(:class:`~odc_pp.odc.transport_host.HostPath`), same-host GPU memory through CUDA IPC
(:class:`~odc_pp.odc.transport_cuda.CudaIpcPath`), other hosts over gloo
(:class:`~odc_pp.odc.transport_crosshost.CrossHostPath`), or every member through
collectives (:class:`~odc_pp.odc.transport_collective.CollectivePath`). An
:class:`~odc_pp.odc.transport_group.OdcGroup` owns its paths and routes each piece of an
operation to the path of the peer it concerns; ``primitives`` checks arguments first, so
paths assume valid ones.

Ordering contract
-----------------
Epochs: ``sync`` number k of a group is epoch k. A member's *interval k* is the time after
its sync k-1 returned and before it enters sync k. "Owner" is the member whose memory an
operation reads or writes; "writes" include its own writes to its symmetric memory
(zeroing or clipping an accumulator, the optimizer writing a parameter shard).

* ``gather`` / ``get`` (reads): see every write the owner made before it entered a sync that
  the reader has returned from. A read in interval k must not overlap the owner's writes
  in interval k (the caller publishes new values across a sync).
* ``scatter_accumulate`` (fp32 adds; non-deterministic mode): lands at the owner some time
  between the call and the issuer's next ``barrier``; ``Work.wait`` returns once it has
  landed. Adds from several sources into one owner never lose an update (chunk locks in the
  owner's control block, atomic adds on the GPU, or the owner's server thread). An add
  issued in interval k lands after every write the owner made before entering sync k-1;
  the owner must not write the same memory in interval k (the engine writes accumulators
  only between the sync that ends accumulation and the next one, when nobody pushes).
* ``put`` (writes): like ``scatter_accumulate`` without the locks (one writer per range).
* ``flush()``: returns once every operation this rank issued on the path has landed at its
  owner (raising the first failure), and once this rank's own queued writes to its
  symmetric memory are complete (CUDA: the current streams are synchronised), so a peer
  that passes the following barrier sees them.
* ``barrier(epoch)``: returns once every member reached by the path has called
  ``barrier(epoch)``: everything any member flushed before it has landed and is visible to
  every member after it.
* Deterministic mode (:mod:`~odc_pp.odc.transport_staged`): ``scatter_accumulate`` only
  stages the contribution privately; sync k applies the staged contributions at every
  owner in source rank order, and **never before the owner has entered sync k**: the
  owner's writes in interval k (zeroing after the optimizer step, in-place clipping)
  happen-before every staged add of sync k. Same host (CPU or CUDA): the owner opens its
  turn counter only after its own flush; sources wait for it. Cross-host: the owner
  applies the contributions it receives itself, inside its sync k, after its own writes.
  GPU cost (decided for CUDA, not yet measured: no GPU was available): staging is an
  ``add_`` on the caller's current stream with no host synchronisation per push; sync k
  applies each owner's slices as one batch on the push stream and waits once per owner
  before passing the turn (``world_size`` host waits per sync). Deterministic mode stays
  the training default on GPU. The same staged path carries CUDA pushes when some pair of
  GPUs lacks native peer atomics (``cudaDevP2PAttrNativeAtomicSupported``).
* Every wait on a peer times out after ``TransportConfig.timeout_s`` with a ``PeerError``
  naming the peer.
"""

from __future__ import annotations

from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Callable, Protocol

import torch

__all__ = ["TransportPath", "Work", "shard_range", "join_works", "peer_order"]


def peer_order(peers, rank: int, world_size: int) -> list[int]:
    """``peers`` in the order ``(rank + i) % world_size``, i = 0, 1, ...: the order every
    path visits owners in a gather. Each rank starts at its own shard, then the next
    rank's, so at any moment the W readers of a gather read W different owners instead
    of all reading owner 0 first (which loads one GPU's links while the others idle)."""
    return sorted(peers, key=lambda peer: (peer - rank) % world_size)


def shard_range(numel: int, rank: int, world_size: int) -> tuple[int, int]:
    """[start, end) of rank's slice of numel elements; shard size ceil(numel / world)."""
    if world_size <= 0 or not 0 <= rank < world_size or numel < 0:
        raise ValueError(f"shard_range needs 0 <= rank < world_size and numel >= 0, got "
                         f"numel={numel}, rank={rank}, world_size={world_size}")
    shard_size = -(-numel // world_size)
    return min(numel, rank * shard_size), min(numel, (rank + 1) * shard_size)


class Work:
    """Handle of an asynchronous scatter_accumulate or put. Do not modify the input before
    wait() (or sync) returns."""

    def __init__(self, future: Future | None = None,
                 waiter: Callable[[float | None], None] | None = None):
        self._future = future
        self._waiter = waiter  # callable(timeout) finishing non-thread work (CUDA, collective)

    def is_completed(self) -> bool:
        return self._waiter is None and (self._future is None or self._future.done())

    def wait(self, timeout: float | None = None) -> None:
        """Block until the write landed; raises its error, or TimeoutError."""
        if self._future is not None:
            try:
                self._future.result(timeout=timeout)
            except FutureTimeout as error:
                raise TimeoutError(f"odc transport: work not done after {timeout} s") from error
        if self._waiter is not None:
            waiter, self._waiter = self._waiter, None
            waiter(timeout)


def join_works(works: list[Work]) -> Work:
    """One handle for several (the pieces of one operation on several paths)."""
    pending = [work for work in works if not work.is_completed()]
    if not pending:
        return works[0] if len(works) == 1 else Work()
    if len(pending) == 1:
        return pending[0]

    def wait(timeout):
        for work in pending:
            work.wait(timeout)

    return Work(waiter=wait)


class TransportPath(Protocol):
    """One kind of peer. Tensors named ``shard``, ``accumulator`` and ``remote`` are
    contiguous views of symmetric tensors (the same bytes of every member's copy are
    meant); see the module docstring for what each operation guarantees about ordering,
    completion and visibility."""

    peers: list[int]
    """Group ranks this path reaches (it moves the pieces of a gather/scatter for them)."""

    def gather(self, output: torch.Tensor, shard: torch.Tensor) -> None:
        """output's slice of every peer in ``peers`` = that peer's shard (a read)."""

    def scatter_accumulate(self, accumulator: torch.Tensor, input: torch.Tensor) -> Work:
        """Add input's slice of every peer in ``peers`` into its fp32 accumulator (async)."""

    def get(self, output: torch.Tensor, remote: torch.Tensor, peer: int) -> None:
        """output = peer's copy of remote (a read)."""

    def put(self, remote: torch.Tensor, input: torch.Tensor, peer: int) -> Work:
        """peer's copy of remote = input; the Work completes once the bytes landed."""

    def flush(self) -> None:
        """Everything issued on this path so far has landed; own queued writes are done."""

    def barrier(self, epoch: int) -> None:
        """Wait until every member reached by this path called barrier(epoch)."""

    def close(self) -> None:
        """Release threads and mappings (idempotent; collective where the path is)."""
