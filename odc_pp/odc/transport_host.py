"""Host (shared-memory) side of the ODC transport: segment names, stale-segment cleanup,
dtype codes, symmetric allocations, and :class:`HostPath`, the path to same-host peers'
CPU memory (see the contract in :mod:`odc_pp.odc.transport_path`).

Segment names are ``odcpp.<creator pid>.<group uid>.<what>``: the pid lets a later run
find segments whose creator died (killed run) and remove them; the uid (chosen by group
rank 0 at ``new_group``) keeps concurrent runs on one host apart.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import torch

from odc_pp import _C
from odc_pp.odc.transport_path import Work, peer_order, shard_range

__all__ = ["SEGMENT_PREFIX", "SHM_DIR", "DTYPE_CODES", "Allocation", "SymmetricMemory",
           "HostPath", "Locator",
           "segment_name", "remove_stale_segments", "list_segments", "dtype_code",
           "tensor_from_segment", "call_all", "wait_all", "drain"]

SEGMENT_PREFIX = "odcpp."
SHM_DIR = "/dev/shm"
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def segment_name(pid: int, uid: str, what: str) -> str:
    return f"/{SEGMENT_PREFIX}{pid}.{uid}.{what}"


def list_segments() -> list[str]:
    """Names (without the leading slash) of this transport's segments in /dev/shm."""
    try:
        return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(SEGMENT_PREFIX))
    except FileNotFoundError:
        return []


def remove_stale_segments() -> list[str]:
    """Unlink segments whose creating process is gone; returns the names removed."""
    removed = []
    for name in list_segments():
        fields = name[len(SEGMENT_PREFIX):].split(".")
        if not fields or not fields[0].isdigit() or _C.pid_alive(int(fields[0])):
            continue
        try:
            os.unlink(os.path.join(SHM_DIR, name))
            removed.append(name)
        except FileNotFoundError:
            pass  # another rank on this host removed it first
    return removed


def dtype_code(dtype: torch.dtype) -> int:
    if dtype not in DTYPE_CODES:
        raise ValueError(f"scatter_accumulate input must be float32, bfloat16 or float16, "
                         f"got {dtype}")
    return DTYPE_CODES[dtype]


def tensor_from_segment(segment, nbytes: int, shape, dtype: torch.dtype) -> torch.Tensor:
    """A tensor over a mapped segment; it keeps the mapping alive while it exists."""
    raw = torch.frombuffer(segment, dtype=torch.uint8)[:nbytes]
    return raw.view(dtype).view(shape)


@dataclass(kw_only=True)
class Allocation:
    """One symmetric allocation: the same size on every member, made in the same order."""

    alloc_id: int
    """Position in the group's allocation order (equal on every member)."""
    base: int
    """Address of this rank's buffer."""
    nbytes: int
    """Size in bytes (equal on every member)."""
    device: torch.device
    """Where the buffer lives (cpu or a cuda device)."""
    peer_bases: list[int | None] = field(default_factory=list)
    """Per group rank: the address at which that rank's buffer is mapped here, or None
    when it lives on another host (reached through the cross-host path)."""
    keep: list = field(default_factory=list)
    """Objects that must outlive the mapping (segments, IPC holders)."""
    local_bytes: torch.Tensor | None = None
    """This rank's CPU buffer as uint8 (served to cross-host peers); None on CUDA."""
    owner: object = None
    """This rank's buffer when the allocation must free it explicitly (CUDA
    ``DeviceBuffer``); None for shared-memory segments and once released."""
    released: bool = False
    """Freed by the group's collective release; no longer located."""

    def contains(self, address: int, nbytes: int) -> bool:
        return (not self.released and self.base <= address
                and address + nbytes <= self.base + self.nbytes)

    def close_peers(self) -> None:
        """Unmap the peers' buffers (idempotent)."""
        for kept in self.keep:
            if hasattr(kept, "close"):
                kept.close()
        self.keep.clear()

    def release(self) -> None:
        """Free this rank's buffer (after every peer closed its mapping of it) and stop
        locating the allocation. Idempotent."""
        self.close_peers()
        self.released = True
        self.local_bytes = None
        owner, self.owner = self.owner, None
        if owner is not None:
            owner.free()


class SymmetricMemory:
    """This rank's symmetric allocations, in allocation order (equal on every member), and
    the operations the paths need on them. Holds no reference to the group, so paths that
    keep its methods do not keep the group alive."""

    def __init__(self, *, rank: int, host=None):
        self.rank = rank
        self.host = host
        """The ``odc_pp._C.HostGroup`` whose chunk locks guard this rank's memory."""
        self.allocations: list[Allocation] = []

    def locate(self, tensor: torch.Tensor, what: str) -> tuple[Allocation, int]:
        """(allocation, byte offset) of a contiguous view of a symmetric tensor."""
        if not tensor.is_contiguous():
            raise ValueError(f"{what} must be contiguous")
        address, nbytes = tensor.data_ptr(), tensor.numel() * tensor.element_size()
        for allocation in self.allocations:
            if allocation.contains(address, nbytes):
                return allocation, address - allocation.base
        raise ValueError(f"{what} must be a view of a tensor from symmetric_empty on this group")

    def local_bytes(self, alloc_id: int, offset: int, nbytes: int) -> torch.Tensor:
        """This rank's bytes [offset, offset + nbytes) of a CPU allocation (uint8 view);
        what the cross-host server reads and writes."""
        if not 0 <= alloc_id < len(self.allocations):
            raise ValueError(f"cross-host request for unknown allocation {alloc_id}")
        allocation = self.allocations[alloc_id]
        if allocation.released:
            raise ValueError(f"cross-host request for released allocation {alloc_id}")
        if offset < 0 or offset + nbytes > allocation.nbytes or allocation.local_bytes is None:
            raise ValueError("cross-host request outside a CPU allocation")
        return allocation.local_bytes[offset:offset + nbytes]

    def accumulate_own(self, alloc_id: int, offset: int, payload: torch.Tensor, dtype: int,
                       count: int) -> None:
        """This rank's fp32 memory at offset += payload (``count`` values of dtype code
        ``dtype``), under its own chunk locks (same-host peers may add concurrently)."""
        if not 0 <= alloc_id < len(self.allocations):
            raise ValueError(f"cross-host accumulate into unknown allocation {alloc_id}")
        allocation = self.allocations[alloc_id]
        if allocation.released:
            raise ValueError(f"cross-host accumulate into released allocation {alloc_id}")
        if offset < 0 or offset + 4 * count > allocation.nbytes:
            raise ValueError("cross-host accumulate outside the allocation")
        self.host.accumulate_into(self.rank, allocation.base + offset, alloc_id, offset,
                                  payload.data_ptr(), dtype, count)

    def close(self) -> None:
        """Unmap the peers' buffers (own tensors stay valid while referenced; own CUDA
        buffers stay owned until the group's collective destroy frees them)."""
        for allocation in self.allocations:
            allocation.close_peers()


# (tensor, what) -> (allocation, byte offset) of a contiguous view of a symmetric tensor
Locator = Callable[[torch.Tensor, str], "tuple[Allocation, int]"]


def call_all(calls) -> None:
    """Call every function of ``calls``; raise the first failure after all ran."""
    first_error = None
    for call in calls:
        try:
            call()
        except Exception as error:  # noqa: BLE001 - finish the others, raise the first
            first_error = first_error or error
    if first_error is not None:
        raise first_error


def wait_all(works: list[Work]) -> None:
    """Wait for every work; raise the first failure after all finished."""
    call_all(work.wait for work in works)


def drain(works: list[Work]) -> None:
    """Wait for every work and drop failures (closing must not raise for earlier ones,
    which were reported by the wait that saw them)."""
    try:
        wait_all(works)
    except Exception:  # noqa: BLE001 - see docstring
        pass


class HostPath:
    """Same-host peers' CPU memory through their shared-memory mappings: reads and writes
    are parallel copies, adds take the owner's chunk locks (``odc_pp._C.HostGroup``) and
    run on one helper thread, barriers use the control blocks."""

    def __init__(self, *, host, locate: Locator, local: list[bool], num_threads: int):
        self.host = host
        self.rank = host.rank
        self.world_size = host.world_size
        self.peers = peer_order([peer for peer in range(self.world_size) if local[peer]],
                                self.rank, self.world_size)  # gathers' order
        self.num_threads = num_threads
        self._locate = locate
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"odcpp-acc-{self.rank}")
        self._pending: list[Work] = []

    def _read(self, peer: int, allocation: Allocation, offset: int, out: torch.Tensor,
              transfer_bytes: int) -> None:
        self.host.check_peer(peer, "get")
        _C.copy_bytes(out.data_ptr(), allocation.peer_bases[peer] + offset,
                      out.numel() * out.element_size(), self.num_threads, transfer_bytes)

    def gather(self, output: torch.Tensor, shard: torch.Tensor) -> None:
        allocation, offset = self._locate(shard, "shard")
        flat = output.view(-1)
        numel = flat.numel()
        for peer in self.peers:
            start, end = shard_range(numel, peer, self.world_size)
            if end > start:
                self._read(peer, allocation, offset, flat[start:end], numel * flat.element_size())

    def get(self, output: torch.Tensor, remote: torch.Tensor, peer: int) -> None:
        allocation, offset = self._locate(remote, "remote")
        out = output.view(-1)
        self._read(peer, allocation, offset, out, out.numel() * out.element_size())

    def put(self, remote: torch.Tensor, input: torch.Tensor, peer: int) -> Work:
        """Complete on return (a CPU copy)."""
        allocation, offset = self._locate(remote, "remote")
        self.host.check_peer(peer, "put")
        data = input.view(-1)
        _C.copy_bytes(allocation.peer_bases[peer] + offset, data.data_ptr(),
                      data.numel() * data.element_size(), self.num_threads)
        return Work()

    def scatter_accumulate(self, accumulator: torch.Tensor, input: torch.Tensor) -> Work:
        allocation, offset = self._locate(accumulator, "accumulator")
        work = Work(self._executor.submit(self._scatter_now, allocation, offset, input))
        self._pending.append(work)
        return work

    def _scatter_now(self, allocation: Allocation, offset: int, input: torch.Tensor) -> None:
        flat = input.view(-1)
        numel, element, code = flat.numel(), flat.element_size(), dtype_code(flat.dtype)
        for step in range(self.world_size):
            peer = (self.rank + 1 + step) % self.world_size  # spread owners over senders
            start, end = shard_range(numel, peer, self.world_size)
            if end > start and peer in self.peers:
                self.host.accumulate_into(peer, allocation.peer_bases[peer] + offset,
                                          allocation.alloc_id, offset,
                                          flat.data_ptr() + start * element, code, end - start)

    def add_now(self, owner: int, allocation: Allocation, offset: int,
                source: torch.Tensor) -> None:
        """owner's fp32 memory at offset += source (fp32 or bf16, contiguous), under the
        owner's chunk locks; returns once it landed (deterministic sync, in turn)."""
        self.host.accumulate_into(owner, allocation.peer_bases[owner] + offset,
                                  allocation.alloc_id, offset, source.data_ptr(),
                                  dtype_code(source.dtype), source.numel())

    def flush(self) -> None:
        pending, self._pending = self._pending, []
        wait_all(pending)

    def barrier(self, epoch: int) -> None:
        self.host.barrier(epoch)

    def close(self) -> None:
        pending, self._pending = self._pending, []
        drain(pending)
        self._executor.shutdown(wait=True)
