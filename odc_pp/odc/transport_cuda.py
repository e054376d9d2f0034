"""CUDA side of the ODC transport: symmetric buffers allocated with cudaMalloc and shared
through cudaIpc memory handles, peer copies and an accumulate kernel on dedicated streams,
events for completion, and :class:`CudaIpcPath`, the path to same-host peers' GPU memory
(see the contract in :mod:`odc_pp.odc.transport_path`). Uses odc_pp._C_cuda, which is
built where nvcc is found.

Streams: per device, one *gather* stream per owner (gather, get: reads of that peer's
memory; a gather's copies from different owners run side by side, visited in the order
``(rank + i) % world_size`` so the readers spread over the owners) and one *push* stream
(scatter_accumulate, put, the deterministic sync's adds: writes into peers' memory), so a
parameter gather never queues behind gradient pushes.

Peer access: a group maps peers' memory only after :func:`ipc_peer_problem` found every
peer's GPU visible and peer-accessible; the trainer checks it up front
(:func:`cuda_ipc_problem`) and falls back to the collective path with a message.

Ordering with torch: every operation first makes its stream wait for the caller's current
stream (so inputs written there are ready); a blocking gather or get then makes the
current stream wait for the copies, like a collective on the current stream. An async
gather (``gather(..., async_op=True)``) returns a :class:`Work` whose ``wait()`` makes the
*then* current stream wait for the copies (no host block): the engine's prefetch issues it
from the compute stream and waits for it on the compute stream when the unit is needed.

Lifetime: a :class:`DeviceBuffer` is owned by its allocation (the tensors made from it
keep it alive too); it is freed only by the group's collective release or destroy, after
every peer closed its mapping (see :meth:`OdcGroup.release
<odc_pp.odc.transport_group.OdcGroup.release>`).

Peer atomics: fp32 ``atomicAdd`` into a peer's memory is only correct where the link
supports native atomics (NVLink, or the same GPU); over PCIe it is not. The group asks
:func:`native_peer_atomics` at every CUDA allocation (the answer is agreed by every member)
and, when any pair lacks them, routes CUDA ``scatter_accumulate`` through the staged path
(:mod:`~odc_pp.odc.transport_staged`): contributions are summed privately and added at
sync with plain stores, one source at a time.
"""

from __future__ import annotations

import importlib

import torch

from odc_pp import _C
from odc_pp.odc.transport_host import Allocation, Locator, drain, dtype_code, wait_all
from odc_pp.odc.transport_path import Work, peer_order, shard_range

__all__ = ["cuda_backend", "DeviceBuffer", "PeerMapping", "CudaStream", "CudaIpcPath",
           "device_identity", "native_peer_atomics", "ipc_peer_problem", "cuda_ipc_problem"]


def cuda_backend():
    """The odc_pp._C_cuda module; a ValueError says how to get it when it is missing."""
    try:
        return importlib.import_module("odc_pp._C_cuda")
    except ImportError as error:
        raise ValueError("CUDA tensors need odc_pp._C_cuda, which was not built (no nvcc at "
                         "install time, or ODC_PP_NO_CUDA=1?); reinstall with nvcc on PATH, "
                         "or pass CPU tensors") from error


def device_identity(device_index: int) -> str:
    """The PCI bus id of a device (names one GPU in every process)."""
    return cuda_backend().pci_bus_id(device_index)


def native_peer_atomics(device_index: int, peer_bus_ids: list[str]) -> bool:
    """Whether float atomics from ``device_index`` into every peer's GPU (by bus id) are
    native; False when a peer's GPU is not visible in this process."""
    backend = cuda_backend()
    return all(backend.native_peer_atomics(device_index, backend.device_by_pci_bus_id(bus))
               for bus in peer_bus_ids)


def ipc_peer_problem(device_index: int, peer_bus_ids: dict[int, str], *, locate=None,
                     can_access=None) -> str | None:
    """Why this process cannot map the GPU memory of the peers (group rank -> PCI bus id)
    through CUDA IPC, or None when it can: a peer's GPU that this process does not see
    (one GPU per process: ``CUDA_VISIBLE_DEVICES`` per rank, SLURM
    ``--gpus-per-task=1``, Kubernetes), or two GPUs without peer access
    (``torch.cuda.can_device_access_peer``). ``locate``/``can_access``: the CUDA queries
    (tests pass mocks)."""
    locate = locate if locate is not None else cuda_backend().device_by_pci_bus_id
    can_access = can_access if can_access is not None else torch.cuda.can_device_access_peer
    for rank, bus in sorted(peer_bus_ids.items()):
        peer = locate(bus)
        if peer < 0:
            return (f"the GPU of group rank {rank} (PCI {bus}) is not visible in this "
                    "process (one GPU per process, e.g. CUDA_VISIBLE_DEVICES per rank or "
                    "SLURM --gpus-per-task=1)")
        if peer != device_index and not can_access(device_index, peer):
            return (f"cuda:{device_index} has no peer access to cuda:{peer} (PCI {bus}, "
                    f"group rank {rank})")
    return None


def cuda_ipc_problem(process_group, device: torch.device) -> str | None:
    """:func:`ipc_peer_problem` for every member of ``process_group`` (collective over
    it; the same answer on every member): None when every member can map every other's
    GPU memory, else the first member's reason, naming it."""
    import torch.distributed as dist

    world = dist.get_world_size(process_group)
    me = dist.get_rank(process_group)
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        bus = device_identity(index)
    except ValueError as error:  # odc_pp._C_cuda missing
        bus, problem = None, str(error)
    buses = [None] * world
    dist.all_gather_object(buses, bus, group=process_group)
    if bus is not None:
        if None in buses:
            problem = "a member has no CUDA transport (odc_pp._C_cuda)"
        else:
            problem = ipc_peer_problem(index, {r: b for r, b in enumerate(buses) if r != me})
    problems = [None] * world
    dist.all_gather_object(problems, problem, group=process_group)
    return next((f"group rank {rank}: {text}" for rank, text in enumerate(problems) if text),
                None)


class DeviceBuffer:
    """Owns one cudaMalloc allocation; exposes it to torch by __cuda_array_interface__
    (a tensor made by :meth:`tensor` keeps this object alive). :meth:`free` releases the
    memory at once (the group calls it once no peer maps the buffer); otherwise it is
    freed when the last reference goes."""

    def __init__(self, nbytes: int, device: torch.device):
        self._C = cuda_backend()
        self.device_index = device.index if device.index is not None else torch.cuda.current_device()
        self.nbytes = nbytes
        self.ptr = self._C.malloc_device(max(nbytes, 1), self.device_index)
        self.__cuda_array_interface__ = {"shape": (max(nbytes, 1),), "typestr": "|u1",
                                         "data": (self.ptr, False), "version": 3,
                                         "strides": None}

    def ipc_handle(self) -> bytes:
        return self._C.ipc_handle(self.ptr, self.device_index)

    def tensor(self, shape, dtype: torch.dtype) -> torch.Tensor:
        raw = torch.as_tensor(self, device=f"cuda:{self.device_index}")[:self.nbytes]
        return raw.view(dtype).view(shape)

    def free(self) -> None:
        """cudaFree now (idempotent). Tensors over the buffer must not be used after it."""
        if self.ptr:
            ptr, self.ptr = self.ptr, 0
            # work queued on any stream of this device may still touch the buffer
            torch.cuda.synchronize(self.device_index)
            self._C.free_device(ptr, self.device_index)

    def __del__(self):
        try:
            if self.ptr:
                self._C.free_device(self.ptr, self.device_index)
                self.ptr = 0
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class PeerMapping:
    """A peer's buffer opened through its IPC handle; closed when dropped."""

    def __init__(self, handle: bytes, device_index: int):
        self._C = cuda_backend()
        self.device_index = device_index
        self.ptr = self._C.ipc_open(handle, device_index)

    def close(self) -> None:
        if self.ptr:
            self._C.ipc_close(self.ptr, self.device_index)
            self.ptr = 0


class CudaStream:
    """One of the transport's dedicated streams on one device, with completion events."""

    def __init__(self, device_index: int):
        self._C = cuda_backend()
        self.device_index = device_index
        self.stream = self._C.stream_create(device_index)

    def after_current(self) -> None:
        """Make this stream wait for the work queued so far on torch's current stream."""
        current = torch.cuda.current_stream(self.device_index).cuda_stream
        event = self.record(current)
        self._C.stream_wait_event(self.stream, event, self.device_index)
        self._C.event_destroy(event, self.device_index)

    def record(self, stream: int | None = None) -> int:
        event = self._C.event_create(self.device_index)
        self._C.event_record(event, self.stream if stream is None else stream, self.device_index)
        return event

    def current_waits(self, event: int | None = None) -> None:
        """Make torch's current stream wait for ``event`` (default: this stream's work so
        far); the event is destroyed (CUDA keeps it until the wait resolved)."""
        event = self.record() if event is None else event
        current = torch.cuda.current_stream(self.device_index).cuda_stream
        self._C.stream_wait_event(current, event, self.device_index)
        self._C.event_destroy(event, self.device_index)

    def wait_event(self, event: int, timeout_s: float) -> bool:
        return self._C.event_wait(event, timeout_s)

    def destroy_event(self, event: int) -> None:
        self._C.event_destroy(event, self.device_index)

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        self._C.copy_async(dst, src, nbytes, self.stream, self.device_index)

    def accumulate(self, dst: int, src: int, dtype: int, count: int, atomic: bool) -> None:
        self._C.accumulate_async(dst, src, dtype, count, atomic, self.stream, self.device_index)


class CudaIpcPath:
    """Same-host peers' GPU memory through cudaIpc mappings (every member must be on this
    host). Reads run on a gather stream, writes and adds on a push stream (per device);
    both first wait for the caller's current stream. A blocking gather or get makes the
    current stream wait for its copies. Adds use atomicAdd, so the group sends
    ``scatter_accumulate`` here only where :attr:`native_atomics` holds. The barrier is the
    host's."""

    def __init__(self, *, host, locate: Locator, timeout_s: float):
        self.host = host
        self.rank = host.rank
        self.world_size = host.world_size
        self.peers = peer_order(range(self.world_size), self.rank, self.world_size)
        """Every member, in the gathers' order ``(rank + i) % world_size``."""
        self.timeout_s = timeout_s
        self.devices: set[int] = set()
        """Devices holding this rank's symmetric buffers (their streams are flushed)."""
        self.native_atomics = True
        """Every member reaches every other's GPU with native float atomics (set by the
        group, equal on every member)."""
        self._locate = locate
        self._streams: dict[tuple[str, int], CudaStream] = {}
        self._pending: list[Work] = []

    def stream(self, device: torch.device, kind: str, peer: int | None = None) -> CudaStream:
        """The ``kind`` ("gather" or "push") stream of ``device``; reads have one stream
        per ``peer``, so the copies from different owners run side by side."""
        index = device.index if device.index is not None else torch.cuda.current_device()
        key = (kind, index, peer)
        if key not in self._streams:
            self._streams[key] = CudaStream(index)
        return self._streams[key]

    def _waiter(self, stream: CudaStream, keep_alive: torch.Tensor):
        event = stream.record()
        keep_alive_ref = [keep_alive]

        def wait(timeout):
            limit = self.timeout_s if timeout is None else timeout
            if not stream.wait_event(event, limit):
                raise _C.PeerError(f"odc transport: CUDA work of rank {self.rank} not "
                                   f"finished after {limit} s")
            stream.destroy_event(event)
            del keep_alive_ref[:]

        return wait

    def gather(self, output: torch.Tensor, shard: torch.Tensor,
               async_op: bool = False) -> Work | None:
        allocation, offset = self._locate(shard, "shard")
        flat = output.view(-1)
        numel, element = flat.numel(), flat.element_size()
        done = []  # (stream, event) per owner, owners in self.peers' order
        for peer in self.peers:
            start, end = shard_range(numel, peer, self.world_size)
            if end > start:
                stream = self.stream(output.device, "gather", peer)
                stream.after_current()
                stream.copy(flat.data_ptr() + start * element,
                            allocation.peer_bases[peer] + offset, (end - start) * element)
                done.append((stream, stream.record()))

        def current_waits(timeout=None) -> None:
            for stream, event in done:
                stream.current_waits(event)

        if not async_op:
            current_waits()
            return None
        return Work(waiter=current_waits)

    def get(self, output: torch.Tensor, remote: torch.Tensor, peer: int) -> None:
        allocation, offset = self._locate(remote, "remote")
        stream = self.stream(output.device, "gather", peer)
        stream.after_current()
        stream.copy(output.data_ptr(), allocation.peer_bases[peer] + offset,
                    output.numel() * output.element_size())
        stream.current_waits()

    def get_many(self, pieces: list[tuple[torch.Tensor, torch.Tensor, int]]) -> Work:
        """Queue every ``(output, remote, peer)`` copy on its owner's gather stream (each
        stream first waits for the current stream's work), record one event per stream;
        the Work's ``wait()`` makes the then current stream wait for all of them."""
        used: dict[int, CudaStream] = {}
        for output, remote, peer in pieces:
            allocation, offset = self._locate(remote, "remote")
            stream = self.stream(output.device, "gather", peer)
            if id(stream) not in used:
                stream.after_current()
                used[id(stream)] = stream
            stream.copy(output.data_ptr(), allocation.peer_bases[peer] + offset,
                        output.numel() * output.element_size())
        done = [(stream, stream.record()) for stream in used.values()]

        def current_waits(timeout=None) -> None:
            for stream, event in done:
                stream.current_waits(event)

        return Work(waiter=current_waits)

    def put(self, remote: torch.Tensor, input: torch.Tensor, peer: int) -> Work:
        allocation, offset = self._locate(remote, "remote")
        stream = self.stream(input.device, "push")
        stream.after_current()
        stream.copy(allocation.peer_bases[peer] + offset, input.data_ptr(),
                    input.numel() * input.element_size())
        work = Work(waiter=self._waiter(stream, input))
        self._pending.append(work)  # flush (sync) waits for it
        return work

    def scatter_accumulate(self, accumulator: torch.Tensor, input: torch.Tensor) -> Work:
        if not self.native_atomics:
            raise ValueError("CudaIpcPath.scatter_accumulate needs native peer atomics; the "
                             "group stages contributions instead (transport_staged)")
        allocation, offset = self._locate(accumulator, "accumulator")
        stream = self.stream(input.device, "push")
        stream.after_current()
        flat = input.view(-1)
        numel, element, code = flat.numel(), flat.element_size(), dtype_code(flat.dtype)
        for step in range(self.world_size):
            peer = (self.rank + 1 + step) % self.world_size  # spread owners over senders
            start, end = shard_range(numel, peer, self.world_size)
            if end > start:
                stream.accumulate(allocation.peer_bases[peer] + offset,
                                  flat.data_ptr() + start * element, code, end - start, True)
        work = Work(waiter=self._waiter(stream, input))
        self._pending.append(work)
        return work

    def add_many(self, owner: int, pieces: list[tuple[Allocation, int, torch.Tensor]]) -> None:
        """owner's fp32 memory at each (allocation, offset) += source (fp32 or bf16, contiguous)
        with plain adds (the deterministic sync's turn serialises writers); one wait for
        all of them, so the adds have landed before the turn passes."""
        if not pieces:
            return
        stream = self.stream(pieces[0][2].device, "push")
        stream.after_current()  # the staged sums were written on the current stream
        for allocation, offset, source in pieces:
            stream.accumulate(allocation.peer_bases[owner] + offset, source.data_ptr(),
                              dtype_code(source.dtype), source.numel(), False)
        self._waiter(stream, [source for _, _, source in pieces])(None)

    def flush(self) -> None:
        pending, self._pending = self._pending, []
        try:
            wait_all(pending)
        finally:
            # own writes queued on the current streams (the optimizer writing a shard, an
            # accumulator being zeroed, staged sums) finish before the host-side barrier /
            # turn that lets peers read and add into our memory
            for index in sorted(self.devices):
                torch.cuda.current_stream(index).synchronize()

    def barrier(self, epoch: int) -> None:
        self.host.barrier(epoch)

    def close(self) -> None:
        pending, self._pending = self._pending, []
        drain(pending)
