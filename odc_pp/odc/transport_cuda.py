"""CUDA side of the ODC transport: symmetric buffers allocated with cudaMalloc and shared
through cudaIpc memory handles, peer copies and an accumulate kernel on a dedicated stream,
events for completion, and :class:`CudaIpcPath`, the path to same-host peers' GPU memory
(see the contract in :mod:`odc_pp.odc.transport_path`). Uses odc_pp._C_cuda, which is
built only where nvcc is found.

Ordering with torch: every operation first makes the dedicated stream wait for the
caller's current stream (so inputs written there are ready); a gather then makes the
current stream wait for the copies, like a collective on the current stream.
"""

from __future__ import annotations

import importlib

import torch

from odc_pp import _C
from odc_pp.odc.transport_host import Allocation, Locator, drain, dtype_code, wait_all
from odc_pp.odc.transport_path import Work, shard_range

__all__ = ["cuda_backend", "DeviceBuffer", "PeerMapping", "CudaStream", "CudaIpcPath"]


def cuda_backend():
    """The odc_pp._C_cuda module; a ValueError says how to get it when it is missing."""
    try:
        return importlib.import_module("odc_pp._C_cuda")
    except ImportError as error:
        raise ValueError("CUDA tensors need odc_pp._C_cuda, which was not built (no nvcc at "
                         "install time?); reinstall with nvcc on PATH, or pass CPU tensors"
                         ) from error


class DeviceBuffer:
    """Owns one cudaMalloc allocation; exposes it to torch by __cuda_array_interface__
    (the tensor keeps this object, hence the memory, alive)."""

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

    def __del__(self):
        try:
            self._C.free_device(self.ptr, self.device_index)
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
    """The transport's dedicated stream on one device, with completion events."""

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

    def current_waits(self) -> None:
        """Make torch's current stream wait for this stream's work so far."""
        event = self.record()
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
    host). Copies and adds run on a dedicated stream per device that first waits for the
    caller's current stream; a gather or get makes the current stream wait for its copies;
    adds use atomicAdd (several sources into one owner). The barrier is the host's."""

    def __init__(self, *, host, locate: Locator, timeout_s: float):
        self.host = host
        self.rank = host.rank
        self.world_size = host.world_size
        self.peers = list(range(self.world_size))
        self.timeout_s = timeout_s
        self.devices: set[int] = set()
        """Devices holding this rank's symmetric buffers (their streams are flushed)."""
        self._locate = locate
        self._streams: dict[int, CudaStream] = {}
        self._pending: list[Work] = []

    def stream(self, device: torch.device) -> CudaStream:
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in self._streams:
            self._streams[index] = CudaStream(index)
        return self._streams[index]

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

    def gather(self, output: torch.Tensor, shard: torch.Tensor) -> None:
        allocation, offset = self._locate(shard, "shard")
        stream = self.stream(output.device)
        stream.after_current()
        flat = output.view(-1)
        numel, element = flat.numel(), flat.element_size()
        for peer in self.peers:
            start, end = shard_range(numel, peer, self.world_size)
            if end > start:
                stream.copy(flat.data_ptr() + start * element,
                            allocation.peer_bases[peer] + offset, (end - start) * element)
        stream.current_waits()

    def get(self, output: torch.Tensor, remote: torch.Tensor, peer: int) -> None:
        allocation, offset = self._locate(remote, "remote")
        stream = self.stream(output.device)
        stream.after_current()
        stream.copy(output.data_ptr(), allocation.peer_bases[peer] + offset,
                    output.numel() * output.element_size())
        stream.current_waits()

    def put(self, remote: torch.Tensor, input: torch.Tensor, peer: int) -> Work:
        allocation, offset = self._locate(remote, "remote")
        stream = self.stream(input.device)
        stream.after_current()
        stream.copy(allocation.peer_bases[peer] + offset, input.data_ptr(),
                    input.numel() * input.element_size())
        work = Work(waiter=self._waiter(stream, input))
        self._pending.append(work)  # flush (sync) waits for it
        return work

    def scatter_accumulate(self, accumulator: torch.Tensor, input: torch.Tensor) -> Work:
        allocation, offset = self._locate(accumulator, "accumulator")
        stream = self.stream(input.device)
        stream.after_current()
        flat = input.view(-1)
        numel, element, code = flat.numel(), flat.element_size(), dtype_code(flat.dtype)
        for peer in self.peers:
            start, end = shard_range(numel, peer, self.world_size)
            if end > start:
                stream.accumulate(allocation.peer_bases[peer] + offset,
                                  flat.data_ptr() + start * element, code, end - start, True)
        work = Work(waiter=self._waiter(stream, input))
        self._pending.append(work)
        return work

    def add_local(self, staging: torch.Tensor, input: torch.Tensor) -> None:
        """Private fp32 staging += input (deterministic mode); returns once done."""
        stream = self.stream(input.device)
        stream.after_current()
        stream.accumulate(staging.data_ptr(), input.data_ptr(), dtype_code(input.dtype),
                          input.numel(), False)
        self._waiter(stream, input)(None)

    def add_now(self, owner: int, allocation: Allocation, offset: int,
                source: torch.Tensor) -> None:
        """owner's fp32 memory at offset += source (fp32; deterministic sync, in turn);
        returns once it landed."""
        stream = self.stream(source.device)
        stream.accumulate(allocation.peer_bases[owner] + offset, source.data_ptr(), 0,
                          source.numel(), False)
        self._waiter(stream, source)(None)

    def flush(self) -> None:
        pending, self._pending = self._pending, []
        try:
            wait_all(pending)
        finally:
            # own writes queued on the current streams (the optimizer writing a shard, an
            # accumulator being zeroed) finish before the host-side barrier / turn that
            # lets peers read and add into our memory
            for index in sorted(self.devices):
                torch.cuda.current_stream(index).synchronize()

    def barrier(self, epoch: int) -> None:
        self.host.barrier(epoch)

    def close(self) -> None:
        pending, self._pending = self._pending, []
        drain(pending)
