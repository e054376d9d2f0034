"""The transport state of one ODC group: its configuration, symmetric allocations and the
path objects that move data to each kind of peer (see :mod:`odc_pp.odc.transport_path`
for the paths' contract). ``primitives`` checks the arguments of the public operations and
calls the methods here.

Paths, by backend and device: ``collective`` -> one :class:`CollectivePath`; ``odc`` with
CPU tensors -> :class:`HostPath` (members on this host) plus :class:`CrossHostPath` (members
on other hosts, if any); ``odc`` with CUDA tensors -> :class:`CudaIpcPath` (every member
must be on this host). Deterministic mode adds a :class:`StagedAccumulation`; so does a
CUDA allocation when some pair of members' GPUs lacks native peer atomics (CUDA pushes are
then staged and added at sync, see :mod:`~odc_pp.odc.transport_cuda`).

Lifetime: an allocation owns its buffer (CPU: the shared-memory segment; CUDA: the
cudaMalloc'd :class:`~odc_pp.odc.transport_cuda.DeviceBuffer`), so dropping the tensor
never frees memory a peer still maps. :meth:`OdcGroup.release` (collective) frees one
allocation: every member flushes, drops the staged buffers of it and closes its mappings
of the peers' buffers; only after every member has done so does the owner free its own.
:meth:`OdcGroup.destroy` does the same for every allocation (collective when the group
has CUDA allocations).
"""

from __future__ import annotations

import os
import socket
import uuid
import weakref
from dataclasses import dataclass

import torch
import torch.distributed as dist

from odc_pp import _C
from odc_pp.odc.transport_collective import CollectivePath
from odc_pp.odc.transport_crosshost import CrossHostPath
from odc_pp.odc.transport_host import (Allocation, HostPath, SymmetricMemory, call_all,
                                       remove_stale_segments, segment_name,
                                       tensor_from_segment)
from odc_pp.odc.transport_gets import ManyGets
from odc_pp.odc.transport_path import TransportPath, Work, join_works
from odc_pp.odc.transport_staged import StagedAccumulation

__all__ = ["TransportConfig", "OdcGroup", "FORCE_CROSS_HOST_ENV"]

FORCE_CROSS_HOST_ENV = "ODC_PP_FORCE_CROSS_HOST"


@dataclass(kw_only=True)
class TransportConfig:
    """How an OdcGroup moves data."""

    backend: str = "odc"
    """"odc" (one-sided, this module) or "collective" (all-gather / reduce-scatter)."""
    timeout_s: float = 60.0
    """Seconds any wait on a peer may take before a PeerError naming the peer."""
    deterministic: bool = False
    """Fixed summation order (bitwise reproducible); accumulations land at sync."""
    num_threads: int = 0
    """Copy/accumulate threads per operation on CPU; 0 = min(4, cpus / ranks on the host)."""
    force_cross_host: bool = False
    """Treat every rank as its own host (tests the gloo path); env ODC_PP_FORCE_CROSS_HOST=1
    does the same."""

    peer_atomics: str = "auto"
    """CUDA scatter_accumulate: "auto" adds with atomics into peers' memory where every
    pair of GPUs supports native peer atomics (NVLink, same GPU) and stages otherwise;
    "never" always stages (contributions summed privately, added at sync in rank order)."""

    def __post_init__(self):
        if self.peer_atomics not in ("auto", "never"):
            raise ValueError(f"TransportConfig.peer_atomics must be 'auto' or 'never', got "
                             f"{self.peer_atomics!r}")
        if self.backend not in ("odc", "collective"):
            raise ValueError(f"TransportConfig.backend must be 'odc' or 'collective', "
                             f"got {self.backend!r}")
        if not self.timeout_s > 0:
            raise ValueError(f"TransportConfig.timeout_s must be > 0, got {self.timeout_s}")
        if self.num_threads < 0:
            raise ValueError(f"TransportConfig.num_threads must be >= 0, got {self.num_threads}")

    def cross_host_forced(self) -> bool:
        return self.force_cross_host or os.environ.get(FORCE_CROSS_HOST_ENV, "0") == "1"


class OdcGroup:
    """Transport state of one process group. Create with primitives.new_group (collective)."""

    def __init__(self, process_group, config: TransportConfig):
        self.process_group = process_group if process_group is not None else dist.group.WORLD
        self.config = config
        self.rank = dist.get_rank(self.process_group)
        self.world_size = dist.get_world_size(self.process_group)
        self.ranks = dist.get_process_group_ranks(self.process_group)
        self.memory = SymmetricMemory(rank=self.rank)
        """This rank's symmetric allocations (what the paths locate tensors in)."""
        self.allocations = self.memory.allocations
        self.epoch = 0
        """Number of syncs so far."""
        self.paths: list[TransportPath] = []
        """Every path this group made (flushed at each sync, closed at destroy)."""
        self.host = None
        """odc backend: the ``odc_pp._C.HostGroup`` (control blocks of this host's members)."""
        self.host_path: HostPath | None = None
        self.cross_host: CrossHostPath | None = None
        """The path to members on other hosts; None when every member is on this host."""
        self.collective: CollectivePath | None = None
        self.staged: StagedAccumulation | None = None
        self._cuda_path = None
        self._destroyed = False
        if config.backend == "odc":
            self._setup_odc()
        else:
            self.collective = CollectivePath(self.process_group, self.rank, self.world_size)
            self.paths.append(self.collective)
        self.gets = ManyGets(self)
        """Multi-piece gets (:meth:`get_many`) and their timings (``gets.timings``)."""
        self._finalizer = weakref.finalize(self, OdcGroup._release, self.memory, self.paths)

    # ------------------------------------------------------------------ setup
    def _all_gather(self, value) -> list:
        values = [None] * self.world_size
        dist.all_gather_object(values, value, group=self.process_group)
        return values

    def _checked_step(self, step) -> None:
        """Run step() on every member; if it failed anywhere, raise everywhere."""
        try:
            step()
            error = None
        except Exception as caught:  # noqa: BLE001 - re-raised below on every member
            error = f"{type(caught).__name__}: {caught}"
        errors = self._all_gather(error)
        failed = {r: e for r, e in enumerate(errors) if e is not None}
        if failed:
            raise RuntimeError(f"odc transport setup failed on group ranks {failed}")

    def _setup_odc(self) -> None:
        remove_stale_segments()
        forced = self.config.cross_host_forced()
        host = f"rank-{dist.get_rank()}" if forced else socket.gethostname()
        infos = self._all_gather({"pid": os.getpid(), "host": host, "uid": uuid.uuid4().hex[:12]})
        self.uid = infos[0]["uid"]
        self.pids = [info["pid"] for info in infos]
        self.local = [info["host"] == host for info in infos]
        controls: list = [None] * self.world_size
        own = _C.Segment.create(segment_name(os.getpid(), self.uid, "ctl"), _C.CONTROL_BYTES)
        _C.init_control(own, os.getpid())
        controls[self.rank] = own

        def map_controls():
            for peer in range(self.world_size):
                if self.local[peer] and peer != self.rank:
                    controls[peer] = _C.Segment.open(
                        segment_name(self.pids[peer], self.uid, "ctl"), _C.CONTROL_BYTES)

        self._checked_step(lambda: None)  # every control segment exists
        self._checked_step(map_controls)
        own.unlink()  # every peer mapped it: nothing can be left behind from here on
        self.controls = controls
        local_ranks = sum(self.local)
        self.num_threads = self.config.num_threads or max(
            1, min(4, (os.cpu_count() or 1) // local_ranks))
        self.host = _C.HostGroup(self.rank, controls, self.ranks, self.pids,
                                 self.config.timeout_s, self.num_threads)
        self.memory.host = self.host
        memory = self.memory
        self.host_path = HostPath(host=self.host, locate=memory.locate, local=self.local,
                                  num_threads=self.num_threads)
        self.paths.append(self.host_path)
        if not all(self.local):
            self.cross_host = CrossHostPath(
                rank=self.rank, world_size=self.world_size, global_ranks=self.ranks,
                uid=self.uid, timeout_s=self.config.timeout_s, local=self.local,
                locate=memory.locate, resolve=memory.local_bytes,
                accumulate=memory.accumulate_own)
            self.paths.append(self.cross_host)
        if self.config.deterministic:
            self.staged = self._make_staged()

    def _make_staged(self) -> StagedAccumulation:
        memory = self.memory
        return StagedAccumulation(
            rank=self.rank, world_size=self.world_size, locate=memory.locate,
            host=self.host, host_path=self.host_path, cuda_path=self.cuda_path,
            cross_host=self.cross_host, num_threads=self.num_threads,
            apply_own=lambda alloc_id, offset, data: memory.accumulate_own(
                alloc_id, offset, data, 0, data.numel()))

    def cuda_path(self):
        """The CUDA IPC path (made on first use; needs odc_pp._C_cuda)."""
        if self._cuda_path is None:
            from odc_pp.odc.transport_cuda import CudaIpcPath
            self._cuda_path = CudaIpcPath(host=self.host, locate=self.memory.locate,
                                          timeout_s=self.config.timeout_s)
            self.paths.append(self._cuda_path)
        return self._cuda_path

    @property
    def destroyed(self) -> bool:
        return self._destroyed

    # ------------------------------------------------------------------ allocations
    def allocate(self, shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A symmetric tensor (collective: every member, same shape/dtype, same order)."""
        numel = 1
        for dim in shape:
            numel *= dim
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        alloc_id = len(self.allocations)
        if device.type == "cuda":
            return self._allocate_cuda(alloc_id, shape, dtype, nbytes, device)
        if device.type != "cpu":
            raise ValueError(f"symmetric_empty supports cpu and cuda devices, got {device}")
        segment = _C.Segment.create(segment_name(os.getpid(), self.uid, f"a{alloc_id}"),
                                    max(nbytes, 1))
        peers: list = [None] * self.world_size

        def map_peers():
            for peer in range(self.world_size):
                if self.local[peer] and peer != self.rank:
                    peers[peer] = _C.Segment.open(
                        segment_name(self.pids[peer], self.uid, f"a{alloc_id}"), max(nbytes, 1))

        self._checked_step(lambda: None)
        self._checked_step(map_peers)
        segment.unlink()
        peers[self.rank] = segment
        tensor = tensor_from_segment(segment, nbytes, shape, dtype)
        self.allocations.append(Allocation(
            alloc_id=alloc_id, base=segment.address, nbytes=nbytes, device=device,
            peer_bases=[p.address if p is not None else None for p in peers],
            keep=[p for p in peers if p is not None],
            local_bytes=tensor_from_segment(segment, nbytes, (nbytes,), torch.uint8)))
        return tensor

    def device_bytes(self) -> int:
        """Bytes of this rank's live CUDA symmetric allocations: ``cudaMalloc``-ed by the
        transport, outside torch's caching allocator (``torch.cuda.max_memory_allocated``
        does not see them)."""
        return sum(a.nbytes for a in self.allocations
                   if a.device.type == "cuda" and not a.released)

    def _allocate_cuda(self, alloc_id, shape, dtype, nbytes, device) -> torch.Tensor:
        from odc_pp.odc.transport_cuda import (DeviceBuffer, PeerMapping, device_identity,
                                               ipc_peer_problem, native_peer_atomics)
        if not all(self.local):
            raise ValueError("CUDA symmetric tensors need every member on one host (CUDA IPC); "
                             "the cross-host path carries CPU tensors only: make one group "
                             "per host (ShardedDataParallel mode 'hierarchical', "
                             "pretrain_gpt.py --dp-mode hierarchical)")
        buffer = DeviceBuffer(nbytes, device)
        infos = self._all_gather({"handle": buffer.ipc_handle(),
                                  "bus_id": device_identity(buffer.device_index)})
        peers: list = [None] * self.world_size
        native = [True]

        def open_peers():
            problem = ipc_peer_problem(buffer.device_index, {
                r: info["bus_id"] for r, info in enumerate(infos) if r != self.rank})
            if problem is not None:
                raise ValueError(f"CUDA IPC cannot map the peers' memory: {problem}; use "
                                 "--dp-mode collective (TransportConfig(backend="
                                 "'collective'))")
            for peer in range(self.world_size):
                if peer != self.rank:
                    peers[peer] = PeerMapping(infos[peer]["handle"], buffer.device_index)
            native[0] = native_peer_atomics(buffer.device_index,
                                            [info["bus_id"] for info in infos])

        self._checked_step(open_peers)
        bases = [buffer.ptr if p is None else p.ptr for p in peers]
        self.allocations.append(Allocation(
            alloc_id=alloc_id, base=buffer.ptr, nbytes=nbytes, device=device, peer_bases=bases,
            keep=[p for p in peers if p is not None], owner=buffer))
        path = self.cuda_path()
        path.devices.add(buffer.device_index)
        native[0] = native[0] and self.config.peer_atomics == "auto"
        everywhere = all(self._all_gather(native[0]))  # the same decision on every member
        if path.native_atomics and not everywhere:
            path.native_atomics = False
            if self.staged is None:  # collective point: every member makes it here
                self.staged = self._make_staged()
        return buffer.tensor(shape, dtype)

    def locate(self, tensor: torch.Tensor, what: str) -> tuple[Allocation, int]:
        """(allocation, byte offset) of a contiguous view of a symmetric tensor."""
        return self.memory.locate(tensor, what)

    # ------------------------------------------------------------------ operations
    def paths_for(self, device: torch.device) -> list[TransportPath]:
        """The paths that together reach every member, for tensors on device."""
        if self.collective is not None:
            return [self.collective]
        if device.type == "cuda":
            return [self.cuda_path()]
        return [path for path in (self.host_path, self.cross_host) if path is not None]

    def path_to(self, peer: int, device: torch.device) -> TransportPath:
        for path in self.paths_for(device):
            if peer in path.peers:
                return path
        raise ValueError(f"no transport path reaches group rank {peer}")

    def gather(self, output: torch.Tensor, shard: torch.Tensor, async_op: bool = False) -> Work:
        """Blocking gather, or (``async_op`` on CUDA) one whose Work's wait() orders the
        then current stream after the copies; elsewhere async_op gathers at once."""
        if async_op and output.is_cuda and self.collective is None:
            return self.cuda_path().gather(output, shard, async_op=True)
        for path in self.paths_for(output.device):
            path.gather(output, shard)
        return Work()

    def _stages(self, input: torch.Tensor) -> bool:
        if self.staged is None:
            return False
        return self.config.deterministic or (input.is_cuda and not self.cuda_path().native_atomics)

    def scatter_accumulate(self, accumulator: torch.Tensor, input: torch.Tensor, *,
                           retain: bool = False) -> Work:
        if self._stages(input):
            self.staged.stage(accumulator, input, retain=retain)
            return Work()
        return join_works([path.scatter_accumulate(accumulator, input)
                           for path in self.paths_for(input.device)])

    def get(self, output: torch.Tensor, remote: torch.Tensor, peer: int) -> None:
        self.path_to(peer, output.device).get(output, remote, peer)

    def get_many(self, pieces: list, *, async_op: bool = False) -> Work:
        """Every ``(output, remote, peer)`` piece issued, then one Work to wait for
        (:class:`~odc_pp.odc.transport_gets.ManyGets`)."""
        return self.gets.issue(pieces, async_op=async_op)

    def put(self, remote: torch.Tensor, input: torch.Tensor, peer: int) -> Work:
        return self.path_to(peer, input.device).put(remote, input, peer)

    def sync(self) -> None:
        """Flush every path, land the staged contributions (deterministic), then the
        barrier of the path that reaches every member (see the paths' contract)."""
        call_all(path.flush for path in list(self.paths))
        self.epoch += 1
        if self.staged is not None:
            self.staged.apply()
        barrier_path = self.collective or self.cross_host or self.host_path
        barrier_path.barrier(self.epoch)

    # ------------------------------------------------------------------ release / teardown
    def release(self, tensor: torch.Tensor) -> None:
        """Free the symmetric allocation ``tensor`` belongs to (collective: every member
        calls it for the same allocation, in the same order). Every member first lands
        its outstanding operations (flush), forgets the allocation's staged contributions
        (those since the last sync are discarded: sync first) and closes its mappings of
        the peers' buffers; once every member has, each frees its own buffer (CUDA; a CPU
        segment is unmapped when its last tensor goes). ``tensor`` and every view of the
        allocation must not be used afterwards."""
        allocation, _ = self.memory.locate(tensor, "tensor")
        call_all(path.flush for path in list(self.paths))
        if self.staged is not None:
            self.staged.drop(allocation.alloc_id)
        self._checked_step(allocation.close_peers)
        allocation.release()

    @staticmethod
    def _release(memory: SymmetricMemory, paths: list) -> None:
        for path in paths:
            path.close()
        memory.close()

    def destroy(self) -> None:
        """Waits for pending work, stops the server thread (collective on the cross-host
        path) and unmaps the peers' buffers. CPU: own tensors stay valid while referenced.
        CUDA allocations: collective (every member calls destroy): once every member on
        this host has unmapped the peers' buffers, each frees its own, and the tensors made
        from them must not be used any more."""
        if self._destroyed:
            return
        self._destroyed = True
        self.gets.close()
        self._finalizer()
        if any(allocation.owner is not None for allocation in self.allocations):
            self.epoch += 1
            self.host.barrier(self.epoch)  # every peer closed its mappings of our buffers
            for allocation in self.allocations:
                allocation.release()
