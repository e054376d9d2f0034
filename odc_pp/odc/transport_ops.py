"""Data movement of an ODC group, per path: same-host shared memory (odc_pp._C), CUDA IPC
(odc_pp._C_cuda) and the cross-host link. ``primitives`` composes these into the public
operations and owns the checks; the functions here assume valid arguments.
"""

from __future__ import annotations

from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING

import torch

from odc_pp import _C
from odc_pp.odc.transport_host import dtype_code

if TYPE_CHECKING:
    from odc_pp.odc.primitives import OdcGroup

__all__ = ["Work", "shard_range", "GroupOps"]

PeerError = _C.PeerError


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

    def __init__(self, future: Future | None = None, waiter=None):
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


class GroupOps:
    """The data movement of an OdcGroup per path; arguments were checked by primitives."""

    @staticmethod
    def read_host(group: OdcGroup, peer: int, allocation, offset: int, out: torch.Tensor,
                  transfer_bytes: int) -> None:
        """out (flat, contiguous) = peer's bytes [offset, offset + out's bytes)."""
        if allocation.peer_bases[peer] is None:
            group._link.get(peer, allocation.alloc_id, offset, out.view(torch.uint8))
            return
        group._host.check_peer(peer, "get")
        _C.copy_bytes(out.data_ptr(), allocation.peer_bases[peer] + offset,
                      out.numel() * out.element_size(), group.num_threads, transfer_bytes)

    @staticmethod
    def write_host(group: OdcGroup, peer: int, allocation, offset: int,
                   data: torch.Tensor) -> None:
        """peer's bytes [offset, offset + data's bytes) = data (flat, contiguous)."""
        if allocation.peer_bases[peer] is None:
            group._link.put(peer, allocation.alloc_id, offset, data.view(torch.uint8))
            return
        group._host.check_peer(peer, "put")
        nbytes = data.numel() * data.element_size()
        _C.copy_bytes(allocation.peer_bases[peer] + offset, data.data_ptr(), nbytes,
                      group.num_threads)

    @staticmethod
    def gather_host(group: OdcGroup, output, allocation, offset: int) -> None:
        flat = output.view(-1)
        numel = flat.numel()
        for peer in range(group.world_size):
            start, end = shard_range(numel, peer, group.world_size)
            if end > start:
                GroupOps.read_host(group, peer, allocation, offset, flat[start:end],
                                   numel * flat.element_size())

    @staticmethod
    def scatter_host(group: OdcGroup, allocation, offset: int, input: torch.Tensor) -> None:
        flat = input.view(-1)
        numel, element, code = flat.numel(), flat.element_size(), dtype_code(flat.dtype)
        for step in range(group.world_size):
            peer = (group.rank + 1 + step) % group.world_size  # spread owners over senders
            start, end = shard_range(numel, peer, group.world_size)
            if end <= start:
                continue
            if allocation.peer_bases[peer] is None:
                group._link.accumulate(peer, allocation.alloc_id, offset,
                                       flat[start:end].view(torch.uint8), code, end - start)
            else:
                group._host.accumulate_into(peer, allocation.peer_bases[peer] + offset,
                                            allocation.alloc_id, offset,
                                            flat.data_ptr() + start * element, code, end - start)

    @staticmethod
    def stream(group: OdcGroup, device: torch.device):
        from odc_pp.odc.transport_cuda import CudaStream
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in group._cuda_streams:
            group._cuda_streams[index] = CudaStream(index)
        return group._cuda_streams[index]

    @staticmethod
    def gather_cuda(group: OdcGroup, output, allocation, offset: int) -> None:
        stream = GroupOps.stream(group, output.device)
        stream.after_current()
        flat = output.view(-1)
        numel, element = flat.numel(), flat.element_size()
        for peer in range(group.world_size):
            start, end = shard_range(numel, peer, group.world_size)
            if end > start:
                stream.copy(flat.data_ptr() + start * element,
                            allocation.peer_bases[peer] + offset, (end - start) * element)
        stream.current_waits()

    @staticmethod
    def cuda_waiter(group: OdcGroup, stream, keep_alive: torch.Tensor):
        event = stream.record()

        def wait(timeout):
            limit = group.config.timeout_s if timeout is None else timeout
            done = stream.wait_event(event, limit)
            if not done:
                raise PeerError(f"odc transport: CUDA work of rank {group.rank} not finished "
                                f"after {limit} s")
            stream.destroy_event(event)
            del keep_alive_ref[:]

        keep_alive_ref = [keep_alive]
        return wait

    @staticmethod
    def get_cuda(group: OdcGroup, peer: int, allocation, offset: int,
                 out: torch.Tensor) -> None:
        stream = GroupOps.stream(group, out.device)
        stream.after_current()
        stream.copy(out.data_ptr(), allocation.peer_bases[peer] + offset,
                    out.numel() * out.element_size())
        stream.current_waits()

    @staticmethod
    def put_cuda(group: OdcGroup, peer: int, allocation, offset: int,
                 data: torch.Tensor) -> Work:
        stream = GroupOps.stream(group, data.device)
        stream.after_current()
        stream.copy(allocation.peer_bases[peer] + offset, data.data_ptr(),
                    data.numel() * data.element_size())
        return Work(waiter=GroupOps.cuda_waiter(group, stream, data))

    @staticmethod
    def scatter_cuda(group: OdcGroup, allocation, offset: int, input: torch.Tensor) -> Work:
        stream = GroupOps.stream(group, input.device)
        stream.after_current()
        flat = input.view(-1)
        numel, element, code = flat.numel(), flat.element_size(), dtype_code(flat.dtype)
        for peer in range(group.world_size):
            start, end = shard_range(numel, peer, group.world_size)
            if end > start:
                stream.accumulate(allocation.peer_bases[peer] + offset,
                                  flat.data_ptr() + start * element, code, end - start, True)
        return Work(waiter=GroupOps.cuda_waiter(group, stream, input))

    @staticmethod
    def stage(group: OdcGroup, allocation, offset: int, input: torch.Tensor) -> None:
        flat = input.view(-1)
        key = (allocation.alloc_id, offset, flat.numel())
        if key not in group._staged:
            group._staged[key] = (allocation, torch.zeros(flat.numel(), dtype=torch.float32,
                                                          device=flat.device))
        staging = group._staged[key][1]
        if flat.is_cuda:
            stream = GroupOps.stream(group, flat.device)
            stream.after_current()
            stream.accumulate(staging.data_ptr(), flat.data_ptr(), dtype_code(flat.dtype),
                              flat.numel(), False)
            GroupOps.cuda_waiter(group, stream, flat)(None)
        else:
            _C.accumulate_local(staging.data_ptr(), flat.data_ptr(), dtype_code(flat.dtype),
                                flat.numel(), group.num_threads)

    @staticmethod
    def apply_staged_turns(group: OdcGroup) -> None:
        """Deterministic sync, same host: at each owner, sources add in rank order."""
        world = group.world_size
        items = sorted(group._staged.items(), key=lambda item: item[0])
        group._host.open_turns(group._epoch)  # our own writes are done: peers may add
        for owner in range(world):
            group._host.take_turn(owner, group._epoch)
            for (alloc_id, offset, numel), (allocation, staging) in items:
                start, end = shard_range(numel, owner, world)
                if end <= start:
                    continue
                destination = allocation.peer_bases[owner] + offset
                source = staging.data_ptr() + 4 * start
                if staging.is_cuda:
                    stream = GroupOps.stream(group, staging.device)
                    stream.accumulate(destination, source, 0, end - start, False)
                    GroupOps.cuda_waiter(group, stream, staging)(None)
                else:
                    group._host.accumulate_into(owner, destination, alloc_id, offset, source, 0,
                                                end - start)
            group._host.pass_turn(owner, group._epoch)

    @staticmethod
    def apply_staged_ordered(group: OdcGroup) -> None:
        """Deterministic sync over the cross-host link: owners receive in source order."""
        world = group.world_size
        items = sorted(group._staged.items(), key=lambda item: item[0])
        outgoing = {}
        for owner in range(world):
            meta, data = [], []
            for (alloc_id, offset, numel), (_, staging) in items:
                start, end = shard_range(numel, owner, world)
                if end > start:
                    meta += [alloc_id, offset, end - start]
                    data.append(staging[start:end])
            outgoing[owner] = (torch.tensor(meta, dtype=torch.int64),
                               torch.cat(data) if data else torch.zeros(0))

        def apply(source, meta, data):
            position = 0
            for alloc_id, offset, count in meta.view(-1, 3).tolist():
                group._accumulate_from_remote(alloc_id, offset,
                                              data[position:position + count], 0, count)
                position += count

        group._link.exchange_ordered(outgoing, apply)
