"""CUDA side of the ODC transport: symmetric buffers allocated with cudaMalloc and shared
through cudaIpc memory handles, peer copies and an accumulate kernel on a dedicated stream,
events for completion. Uses odc_pp._C_cuda, which is built only where nvcc is found.

Ordering with torch: every operation first makes the dedicated stream wait for the
caller's current stream (so inputs written there are ready); a gather then makes the
current stream wait for the copies, like a collective on the current stream.
"""

from __future__ import annotations

import importlib

import torch

__all__ = ["cuda_backend", "DeviceBuffer", "CudaStream"]


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
