"""Saved-activation store: accounting for every F, offload/reload for chosen (chunk, mb).

While a chunk's forward runs inside :meth:`ActivationStore.capture`, autograd's saved
tensors go through ``torch.autograd.graph.saved_tensors_hooks``: parameters are passed
through untouched, every other tensor is kept in a per-(chunk, microbatch) entry whose
bytes count as *resident on the compute device*. ``offload(key)`` copies the entry's
tensors larger than ``min_offload_bytes`` into a host pool and drops the device copies
(pinned buffers filled on a side stream on GPU; on CPU the same path into a separate pool
allocation); ``reload(key)`` brings them back (the unpack hook waits for the copy, or
reloads on demand if the schedule has no RELOAD before the backward). ``release(key)``
forgets the entry after the backward.

Streams (GPU): both directions run on one side stream with explicit event dependencies.
OFFLOAD waits for an event recorded on the compute stream at the action (the forward that
produced the tensors), copies into pinned host memory and marks the device tensors as used
by the side stream, so their memory is reused only after the copy. RELOAD does not wait for
the compute stream at all: its device buffers are allocated from the side stream's pool,
its source is the pinned copy that the same stream wrote, so the copy overlaps the compute
queued before it; the backward's unpack hook makes the compute stream wait for the copy's
event, and the reloaded tensor is marked as used by the compute stream. Cost: the caching
allocator keeps each stream's pool apart, so blocks freed by OFFLOAD (compute pool) are
not reused by RELOAD (side pool); the reserved memory can exceed the allocated peak by up
to the reload working set (the offload GPU test measures the reserved peak).

Transfer timing: with a ``clock`` (:class:`~odc_pp.runtime.timing.ActionClock`), each
OFFLOAD/RELOAD leaves the marks around its copies on the side stream, which the runtime
takes (:meth:`ActivationStore.take_transfer_span`) as the action's timing: the profiler's
offload bandwidth is the copies' device time, not the launch time.

Accounting is per distinct tensor (same storage, shape and strides counted once), for
tensors on the compute device's type only (host tensors of a GPU run pass through).
Tensors that a deferred W closure still holds after B (the weight-gradient queue owns
them: saved inputs, output gradients, a kept or re-gathered sequence-parallel input) count
as resident from that B to its W: the runtime passes their bytes to
:meth:`ActivationStore.hold_for_weight_grad` and drops them at W.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["ActivationStore"]

Key = tuple[int, int]


class _Slot:
    __slots__ = ("device_tensor", "host_tensor", "nbytes", "ready", "movable")

    def __init__(self, tensor: torch.Tensor, movable: bool) -> None:
        self.device_tensor = tensor
        self.host_tensor = None
        self.nbytes = tensor.numel() * tensor.element_size()
        self.ready = None  # CUDA event of an in-flight copy
        self.movable = movable


@dataclass
class _Entry:
    slots: dict = field(default_factory=dict)
    offloaded: bool = False
    covered: dict = field(default_factory=dict)
    """Per storage (data pointer): the byte ranges of it already counted."""


def _newly_covered(ranges: list[tuple[int, int]], start: int, end: int) -> int:
    """Add ``[start, end)`` to the disjoint sorted ``ranges`` (in place); return how many
    of its bytes were not covered before."""
    new = end - start
    merged = []
    for lo, hi in ranges:
        if hi < start or lo > end:
            merged.append((lo, hi))
            continue
        new -= max(0, min(hi, end) - max(lo, start))
        start, end = min(lo, start), max(hi, end)
    merged.append((start, end))
    ranges[:] = sorted(merged)
    return max(new, 0)


def _byte_range(tensor: torch.Tensor) -> tuple[int, int]:
    """The bytes of its storage a tensor can reach (its extent, gaps of strides included)."""
    size = tensor.element_size()
    if tensor.numel() == 0:
        return tensor.storage_offset() * size, tensor.storage_offset() * size
    extent = 1 + sum((n - 1) * abs(s) for n, s in zip(tensor.shape, tensor.stride()))
    start = tensor.storage_offset() * size
    return start, start + extent * size


class ActivationStore:
    """Per-runtime store of saved activations (see module docstring)."""

    def __init__(self, *, parameters, device: torch.device, min_offload_bytes: int = 1024,
                 clock=None):
        self.device = torch.device(device)
        self.min_offload_bytes = min_offload_bytes
        self._parameters = list(parameters)
        self._param_ptrs: set[int] = set()
        self._entries: dict[Key, _Entry] = {}
        self.resident_bytes = 0
        self.host_bytes = 0
        self.peak_resident_bytes = 0
        self.captured_bytes: dict[Key, int] = {}
        self._held_for_w: dict[Key, int] = {}
        use_cuda = self.device.type == "cuda"
        self._stream = torch.cuda.Stream(device=self.device) if use_cuda else None
        self._clock = clock
        self._span = None

    @property
    def side_stream(self):
        """The CUDA stream the copies run on (None on CPU)."""
        return self._stream

    def take_transfer_span(self):
        """(begin, end) clock marks of the last OFFLOAD/RELOAD's copies, once; else None."""
        span, self._span = self._span, None
        return span

    def _mark(self):
        return self._clock.mark(self._stream) if self._clock is not None else None

    # ----- capture ---------------------------------------------------------------
    def capture(self, key: Key):
        """Context manager for the forward of ``key``."""
        entry = self._entries.setdefault(key, _Entry())
        # read now: a data-parallel engine may have re-materialised parameter storage
        self._param_ptrs = {p.data_ptr() for p in self._parameters}
        return torch.autograd.graph.saved_tensors_hooks(
            lambda tensor: self._pack(entry, key, tensor), self._unpack)

    def _pack(self, entry: _Entry, key: Key, tensor: torch.Tensor):
        # parameters never move; tensors already off the compute device (e.g. the CPU
        # RNG state a recomputed dropout saves on a GPU run) are not device memory
        if tensor.data_ptr() in self._param_ptrs or tensor.device.type != self.device.type:
            return tensor
        ident = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(),
                 tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)
        slot = entry.slots.get(ident)
        if slot is None:
            movable = tensor.numel() * tensor.element_size() >= self.min_offload_bytes
            slot = entry.slots[ident] = _Slot(tensor, movable)
            # storage counted once: views of bytes already saved add nothing
            ranges = entry.covered.setdefault(ident[0], [])
            slot.nbytes = _newly_covered(ranges, *_byte_range(tensor))
            self._add_resident(slot.nbytes)
            self.captured_bytes[key] = self.captured_bytes.get(key, 0) + slot.nbytes
        return slot

    def _unpack(self, packed):
        if not isinstance(packed, _Slot):
            return packed
        if packed.device_tensor is None:
            self._reload_slot(packed)
        if packed.ready is not None:
            torch.cuda.current_stream(self.device).wait_event(packed.ready)
            packed.ready = None
        return packed.device_tensor

    # ----- movement --------------------------------------------------------------
    def offload(self, key: Key) -> int:
        """Move the movable tensors of ``key`` to the host pool; returns bytes moved."""
        entry = self._entry(key, "OFFLOAD")
        if self._stream is not None:  # the forward that wrote the tensors comes first
            produced = torch.cuda.Event()
            produced.record(torch.cuda.current_stream(self.device))
            self._stream.wait_event(produced)
        begin = self._mark()
        moved = 0
        for slot in entry.slots.values():
            if not slot.movable or slot.device_tensor is None:
                continue
            slot.host_tensor = self._copy(slot.device_tensor, to_host=True)
            slot.device_tensor = None
            moved += slot.nbytes
        if begin is not None:
            self._span = (begin, self._mark())
        entry.offloaded = True
        self.resident_bytes -= moved
        self.host_bytes += moved
        return moved

    def reload(self, key: Key) -> int:
        """Bring ``key``'s offloaded tensors back to the device; returns bytes moved."""
        entry = self._entry(key, "RELOAD")
        begin = self._mark()
        moved = 0
        for slot in entry.slots.values():
            if slot.device_tensor is None:
                moved += self._reload_slot(slot)
        entry.offloaded = False
        if begin is not None:
            self._span = (begin, self._mark())
        return moved

    def release(self, key: Key) -> None:
        """The backward of ``key`` has run: forget its saved tensors."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        for slot in entry.slots.values():
            if slot.device_tensor is not None:
                self.resident_bytes -= slot.nbytes
            else:
                self.host_bytes -= slot.nbytes
            slot.device_tensor = slot.host_tensor = None

    def hold_for_weight_grad(self, key: Key, nbytes: int) -> None:
        """The backward of ``key`` left ``nbytes`` of tensors to its deferred W."""
        if nbytes:
            self._held_for_w[key] = self._held_for_w.get(key, 0) + nbytes
            self._add_resident(nbytes)

    def release_weight_grad(self, key: Key) -> None:
        """The W of ``key`` has run: its held tensors are gone."""
        self.resident_bytes -= self._held_for_w.pop(key, 0)

    def reset_peak(self) -> None:
        self.peak_resident_bytes = self.resident_bytes
        self.captured_bytes.clear()

    def __len__(self) -> int:
        return len(self._entries)

    # ----- helpers ---------------------------------------------------------------
    def _entry(self, key: Key, what: str) -> _Entry:
        entry = self._entries.get(key)
        if entry is None:
            raise ValueError(f"{what} of (chunk, microbatch) {key} before its forward: "
                             "place OFFLOAD/RELOAD between F and B in the schedule")
        return entry

    def _reload_slot(self, slot: _Slot) -> int:
        slot.device_tensor = self._copy(slot.host_tensor, to_host=False)
        if self._stream is not None:
            slot.ready = torch.cuda.Event()
            slot.ready.record(self._stream)
        slot.host_tensor = None
        self.host_bytes -= slot.nbytes
        self._add_resident(slot.nbytes)
        return slot.nbytes

    def _copy(self, tensor: torch.Tensor, *, to_host: bool) -> torch.Tensor:
        if self._stream is None:
            return tensor.clone()  # CPU: a separate allocation in the host pool
        compute = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self._stream):
            # device targets come from the side stream's pool: no compute-stream block
            # still in use can be handed out, so the reload need not wait for compute
            target = torch.empty(tensor.shape, dtype=tensor.dtype,
                                 device="cpu" if to_host else self.device,
                                 pin_memory=to_host)
            target.copy_(tensor, non_blocking=True)
        if to_host:
            tensor.record_stream(self._stream)  # freed only after the copy read it
        else:
            target.record_stream(compute)  # the backward reads it on the compute stream
        return target

    def _add_resident(self, nbytes: int) -> None:
        self.resident_bytes += nbytes
        self.peak_resident_bytes = max(self.peak_resident_bytes, self.resident_bytes)
