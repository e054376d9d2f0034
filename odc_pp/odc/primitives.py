"""ODC primitives: one-sided gather and scatter-accumulate with a torch.distributed-like API.

``gather_into_tensor`` pulls every member's shard without the owners taking part;
``scatter_accumulate`` pushes slices of a gradient into the owners' fp32 accumulators,
asynchronously; ``sync`` is the once-per-minibatch wait after which every accumulation
issued before it has landed. ``get`` and ``put`` read and write one peer's copy of a
symmetric tensor (the building blocks, exposed for other protocols). Paths, chosen per peer:

* same host, CPU tensors: POSIX shared memory (odc_pp._C), locked fp32 adds;
* same host, CUDA tensors: cudaIpc handles, copies and an atomic add kernel on a
  dedicated stream (odc_pp._C_cuda);
* other host (or ``force_cross_host``): gloo point-to-point answered by the owner's
  server thread (CPU tensors only).

Concurrency: accumulations from several ranks into one owner take per-chunk spin locks in
the owner's shared control block (CPU) or use atomicAdd (CUDA). Deterministic mode
stages every contribution in a private fp32 buffer and applies them at ``sync`` in source
rank order (turn-taking on shared counters; over gloo, the owner receives sources in rank
order), so results are bitwise reproducible. ``sync`` must be called by every member the
same number of times; a shard/accumulator may be any contiguous view of a tensor from
``symmetric_empty``.
"""

from __future__ import annotations

import os
import socket
import uuid
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
import torch.distributed as dist

from odc_pp import _C
from odc_pp.odc import transport_collective as collective
from odc_pp.odc.transport_crosshost import CrossHostLink
from odc_pp.odc.transport_host import (Allocation, dtype_code, remove_stale_segments,
                                       segment_name, tensor_from_segment)
from odc_pp.odc.transport_ops import GroupOps, Work, shard_range

__all__ = ["TransportConfig", "OdcGroup", "Work", "PeerError", "new_group", "symmetric_empty",
           "shard_range", "gather_into_tensor", "scatter_accumulate", "get", "put", "sync",
           "FORCE_CROSS_HOST_ENV"]

PeerError = _C.PeerError
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

    def __post_init__(self):
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
    """Transport state of one process group. Create with new_group (collective)."""

    def __init__(self, process_group, config: TransportConfig):
        self.process_group = process_group if process_group is not None else dist.group.WORLD
        self.config = config
        self.rank = dist.get_rank(self.process_group)
        self.world_size = dist.get_world_size(self.process_group)
        self.ranks = dist.get_process_group_ranks(self.process_group)
        self.allocations: list[Allocation] = []
        self._pending: list[Work] = []
        self._calls_since_sync = 0
        self._epoch = 0
        self._staged: dict[tuple, tuple[Allocation, torch.Tensor]] = {}
        self._cuda_streams: dict[int, object] = {}
        self._link: CrossHostLink | None = None
        self._host = None
        self._destroyed = False
        self._executor = None
        if config.backend == "odc":
            self._setup_odc()
        self._finalizer = weakref.finalize(self, OdcGroup._release, self.allocations,
                                           self._link, self._executor)

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
        self._controls = controls
        local_ranks = sum(self.local)
        self.num_threads = self.config.num_threads or max(
            1, min(4, (os.cpu_count() or 1) // local_ranks))
        self._host = _C.HostGroup(self.rank, controls, self.ranks, self.pids,
                                  self.config.timeout_s, self.num_threads)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"odcpp-acc-{self.rank}")
        if not all(self.local):
            self._link = CrossHostLink(rank=self.rank, world_size=self.world_size,
                                       global_ranks=self.ranks, uid=self.uid,
                                       timeout_s=self.config.timeout_s,
                                       resolve=self._resolve_local,
                                       accumulate=self._accumulate_from_remote)

    # ------------------------------------------------------------------ allocations
    def allocate(self, shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
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

    def _allocate_cuda(self, alloc_id, shape, dtype, nbytes, device) -> torch.Tensor:
        from odc_pp.odc.transport_cuda import DeviceBuffer, PeerMapping
        if not all(self.local):
            raise ValueError("CUDA symmetric tensors need every member on one host (CUDA IPC); "
                             "the cross-host path carries CPU tensors only: make one group "
                             "per host (ShardedDataParallel mode 'hierarchical', "
                             "pretrain_gpt.py --dp-mode hierarchical)")
        buffer = DeviceBuffer(nbytes, device)
        handles = self._all_gather(buffer.ipc_handle())
        peers: list = [None] * self.world_size

        def open_peers():
            for peer in range(self.world_size):
                if peer != self.rank:
                    peers[peer] = PeerMapping(handles[peer], buffer.device_index)

        self._checked_step(open_peers)
        bases = [buffer.ptr if p is None else p.ptr for p in peers]
        self.allocations.append(Allocation(
            alloc_id=alloc_id, base=buffer.ptr, nbytes=nbytes, device=device, peer_bases=bases,
            keep=[p for p in peers if p is not None]))
        return buffer.tensor(shape, dtype)

    def locate(self, tensor: torch.Tensor, what: str) -> tuple[Allocation, int]:
        """(allocation, byte offset) of a contiguous view of a symmetric tensor."""
        if not tensor.is_contiguous():
            raise ValueError(f"{what} must be contiguous")
        address, nbytes = tensor.data_ptr(), tensor.numel() * tensor.element_size()
        for allocation in self.allocations:
            if allocation.contains(address, nbytes):
                return allocation, address - allocation.base
        raise ValueError(f"{what} must be a view of a tensor from symmetric_empty on this group")

    def _resolve_local(self, alloc_id: int, offset: int, nbytes: int) -> torch.Tensor:
        allocation = self.allocations[alloc_id]
        if offset < 0 or offset + nbytes > allocation.nbytes or allocation.local_bytes is None:
            raise ValueError("cross-host request outside a CPU allocation")
        return allocation.local_bytes[offset:offset + nbytes]

    def _accumulate_from_remote(self, alloc_id, offset, payload, dtype, count) -> None:
        allocation = self.allocations[alloc_id]
        if offset < 0 or offset + 4 * count > allocation.nbytes:
            raise ValueError("cross-host accumulate outside the allocation")
        self._host.accumulate_into(self.rank, allocation.base + offset, alloc_id, offset,
                                   payload.data_ptr(), dtype, count)

    # ------------------------------------------------------------------ teardown
    @staticmethod
    def _release(allocations, link, executor) -> None:
        if executor is not None:
            executor.shutdown(wait=True)
        if link is not None:
            link.close()
        for allocation in allocations:
            for kept in allocation.keep:
                if hasattr(kept, "close"):
                    kept.close()
            allocation.keep.clear()

    def destroy(self) -> None:
        """Waits for pending work, stops the server thread (collective on the cross-host
        path) and unmaps the peers' buffers. Own tensors stay valid while referenced."""
        if self._destroyed:
            return
        self._destroyed = True
        for work in self._pending:
            try:
                work.wait()
            except Exception:  # noqa: BLE001 - destroy must not raise for earlier failures
                pass
        self._pending.clear()
        self._finalizer()


def _finish_device_writes(group: OdcGroup) -> None:
    """Wait for this rank's queued CUDA work (e.g. the optimizer writing its shard, or an
    accumulator being zeroed): the barrier that follows is on the host, and peers read and
    add into our device memory right after it."""
    devices = {allocation.device for allocation in group.allocations
               if allocation.device.type == "cuda"}
    for device in devices:
        torch.cuda.current_stream(device).synchronize()


def _check_usable(group: OdcGroup) -> None:
    if not isinstance(group, OdcGroup):
        raise ValueError(f"group must be an OdcGroup from odc_pp.odc.primitives.new_group, "
                         f"got {type(group).__name__}")
    if group._destroyed:
        raise ValueError("this OdcGroup was destroyed; create a new one with new_group")


def _check_shard(full: torch.Tensor, part: torch.Tensor, group: OdcGroup, what: str) -> int:
    shard_size = -(-full.numel() // group.world_size)
    if part.numel() != shard_size:
        raise ValueError(f"{what} must hold ceil({full.numel()} / {group.world_size}) = "
                         f"{shard_size} elements, got {part.numel()}")
    if not full.is_contiguous():
        raise ValueError("the full-size tensor (output / input) must be contiguous")
    if full.device != part.device:
        raise ValueError(f"{what} is on {part.device} but the full tensor on {full.device}")
    return shard_size


def new_group(process_group=None, *, config: TransportConfig | None = None) -> OdcGroup:
    """Collective over the members of process_group (None = WORLD)."""
    return OdcGroup(process_group, config if config is not None else TransportConfig())


def symmetric_empty(shape, dtype: torch.dtype, group: OdcGroup, device=None) -> torch.Tensor:
    """Uninitialised tensor in symmetric memory. Collective: every member calls it with the
    same shape and dtype, in the same order."""
    _check_usable(group)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    device = torch.device(device) if device is not None else torch.device("cpu")
    if group.config.backend == "collective":
        return torch.empty(shape, dtype=dtype, device=device)
    return group.allocate(shape, dtype, device)


def gather_into_tensor(output: torch.Tensor, shard: torch.Tensor, group: OdcGroup) -> None:
    """output[start_r:end_r] = rank r's shard[:end_r - start_r] for every member r, read
    one-sidedly (the owners do not take part)."""
    _check_usable(group)
    if output.dtype != shard.dtype:
        raise ValueError(f"output dtype {output.dtype} differs from shard dtype {shard.dtype}")
    _check_shard(output, shard, group, "shard")
    if group.config.backend == "collective":
        collective.gather_collective(output, shard, group.process_group)
        return
    if output.numel() == 0:  # (torch gives empty tensors data_ptr 0: nothing to locate)
        return
    allocation, offset = group.locate(shard, "shard")
    if output.is_cuda:
        GroupOps.gather_cuda(group, output, allocation, offset)
    else:
        GroupOps.gather_host(group, output, allocation, offset)


def scatter_accumulate(accumulator: torch.Tensor, input: torch.Tensor, group: OdcGroup) -> Work:
    """Asynchronously add input[start_r:end_r] into rank r's accumulator[:end_r - start_r]
    (fp32) for every member r. Members may call it different numbers of times (odc
    backend); everything issued before a sync has landed once sync returns everywhere."""
    _check_usable(group)
    if accumulator.dtype != torch.float32:
        raise ValueError(f"accumulator must be float32, got {accumulator.dtype}")
    dtype_code(input.dtype)
    _check_shard(input, accumulator, group, "accumulator")
    group._calls_since_sync += 1
    if group.config.backend == "collective":
        start, end = shard_range(input.numel(), group.rank, group.world_size)
        work, finish = collective.reduce_scatter_accumulate(accumulator, input,
                                                            group.process_group, end - start)

        def wait(timeout):
            work.wait()
            finish()

        handle = Work(waiter=wait)
        group._pending.append(handle)
        return handle
    if input.numel() == 0:
        return Work()
    allocation, offset = group.locate(accumulator, "accumulator")
    if group.config.deterministic:
        GroupOps.stage(group, allocation, offset, input)
        return Work()
    if input.is_cuda:
        handle = GroupOps.scatter_cuda(group, allocation, offset, input)
    else:
        handle = Work(group._executor.submit(GroupOps.scatter_host, group, allocation, offset,
                                             input))
    group._pending.append(handle)
    return handle


def get(output: torch.Tensor, remote: torch.Tensor, peer: int, group: OdcGroup) -> None:
    """output = ``peer``'s copy of ``remote``, read one-sidedly (``peer`` does not take
    part). ``remote`` is a contiguous view of a tensor from ``symmetric_empty``; the same
    bytes of peer's buffer are read. What peer wrote before a ``sync`` that both passed is
    visible. On CUDA the copy is ordered on the current stream, like a collective."""
    _check_point_to_point(output, remote, peer, group, "get", "output")
    if output.numel() == 0:
        return
    allocation, offset = group.locate(remote, "remote")
    if output.is_cuda:
        GroupOps.get_cuda(group, peer, allocation, offset, output.view(-1))
    else:
        GroupOps.read_host(group, peer, allocation, offset, output.view(-1),
                           output.numel() * output.element_size())


def put(remote: torch.Tensor, input: torch.Tensor, peer: int, group: OdcGroup) -> Work:
    """Write ``input`` into ``peer``'s copy of ``remote`` one-sidedly (see :func:`get` for
    ``remote``). Once the returned work's ``wait()`` (or this rank's next ``sync``) has
    returned the bytes are in peer's memory; peer may read them after that ``sync``. CPU
    puts are complete on return."""
    _check_point_to_point(input, remote, peer, group, "put", "input")
    if input.numel() == 0:
        return Work()
    allocation, offset = group.locate(remote, "remote")
    if not input.is_cuda:
        GroupOps.write_host(group, peer, allocation, offset, input.view(-1))
        return Work()
    work = GroupOps.put_cuda(group, peer, allocation, offset, input.view(-1))
    group._pending.append(work)  # sync waits for it, as for scatter_accumulate
    return work


def _check_point_to_point(local: torch.Tensor, remote: torch.Tensor, peer: int,
                          group: OdcGroup, op: str, name: str) -> None:
    _check_usable(group)
    if group.config.backend != "odc":
        raise ValueError(f"{op} is one-sided and needs TransportConfig(backend='odc'), not "
                         f"{group.config.backend!r}")
    if not 0 <= peer < group.world_size:
        raise ValueError(f"{op}: peer must be a group rank in [0, {group.world_size}), "
                         f"got {peer}")
    if local.dtype != remote.dtype or local.numel() != remote.numel():
        raise ValueError(f"{op}: {name} ({local.numel()} x {local.dtype}) must match remote "
                         f"({remote.numel()} x {remote.dtype})")
    if not (local.is_contiguous() and remote.is_contiguous()):
        raise ValueError(f"{op}: {name} and remote must be contiguous")
    if local.device.type != remote.device.type:
        raise ValueError(f"{op}: {name} is on {local.device} but remote on {remote.device}")


def sync(group: OdcGroup) -> None:
    """Once-per-minibatch barrier: when it has returned on every member, every
    scatter_accumulate any member issued before its sync has landed, and so has every
    write a member queued on its current CUDA stream (e.g. to its shards) before it."""
    _check_usable(group)
    pending, group._pending = group._pending, []
    first_error = None
    for work in pending:
        try:
            work.wait()
        except Exception as error:  # noqa: BLE001 - finish the others, raise the first
            first_error = first_error or error
    if first_error is not None:
        raise first_error
    if group.config.backend == "collective":
        collective.check_call_counts(group._calls_since_sync, group.rank, group.process_group)
        group._calls_since_sync = 0
        return
    group._calls_since_sync = 0
    group._epoch += 1
    _finish_device_writes(group)
    if group.config.deterministic:
        if group._link is not None:
            GroupOps.apply_staged_ordered(group)
        else:
            GroupOps.apply_staged_turns(group)
        for _, staging in group._staged.values():
            staging.zero_()
    if group._link is not None:
        group._link.barrier(group._epoch)
    else:
        group._host.barrier(group._epoch)
