"""Host-to-device copies of microbatch tensors through reusable pinned buffers (issue 50).

The runtime keeps microbatches on the host; the model moves tokens, positions, labels,
segment ids and the loss mask to the GPU inside F. A ``non_blocking`` copy from pageable
memory is not asynchronous: CUDA stages it through its own pinned buffer and may
synchronise the stream. :func:`to_device` copies a host tensor into a pinned buffer first
(a host ``memcpy``) and issues the device copy from there, truly asynchronous.

Buffers are pooled per ``(dtype, element count)``. Each use records an event on the
copying stream after the copy; a buffer is reused only once its event has completed (the
copy out of it finished), so a later microbatch never overwrites bytes still being read.
A pool holds at most :data:`MAX_BUFFERS` buffers a shape; past that the oldest one's
event is waited for. On a CPU device, or for a tensor already on the device or already
pinned, :func:`to_device` is a plain ``.to``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

__all__ = ["MAX_BUFFERS", "PinnedPool", "to_device"]

MAX_BUFFERS = 64
"""Pinned buffers kept per (dtype, element count): enough that a step's microbatches in
flight never wait (the wait past it is a host synchronisation)."""


@dataclass(kw_only=True)
class _Slot:
    buffer: torch.Tensor
    """The pinned host buffer."""
    event: object | None = None
    """The event recorded after the last copy out of it (None: never used)."""


@dataclass(kw_only=True)
class PinnedPool:
    """Pinned staging buffers, reused once their last copy completed."""

    pin: Callable[[torch.Size, torch.dtype], torch.Tensor] = field(
        default=lambda shape, dtype: torch.empty(shape, dtype=dtype, pin_memory=True))
    """Allocates a pinned host tensor (tests pass a plain allocator)."""
    new_event: Callable[[], object] = field(default=lambda: torch.cuda.Event())
    """Makes an event with ``record()``, ``query()`` and ``synchronize()``."""
    max_buffers: int = MAX_BUFFERS
    """Buffers kept per (dtype, element count)."""
    slots: dict[tuple, list[_Slot]] = field(default_factory=dict)
    """The pool: (dtype, element count) -> its buffers, least recently used first."""

    def _free_slot(self, key: tuple, shape: torch.Size, dtype: torch.dtype) -> _Slot:
        slots = self.slots.setdefault(key, [])
        for slot in slots:
            if slot.event is None or slot.event.query():
                slots.remove(slot)
                slots.append(slot)
                return slot
        if len(slots) < self.max_buffers:
            slot = _Slot(buffer=self.pin(torch.Size([key[1]]), dtype))
            slots.append(slot)
            return slot
        slot = slots.pop(0)  # every buffer is in flight: wait for the oldest copy
        slot.event.synchronize()
        slots.append(slot)
        return slot

    def copy(self, tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
        """``tensor`` (host) on ``device``, copied asynchronously from a pinned buffer."""
        key = (tensor.dtype, tensor.numel())
        slot = self._free_slot(key, tensor.shape, tensor.dtype)
        staged = slot.buffer.view(tensor.shape)
        staged.copy_(tensor)
        out = staged.to(device, non_blocking=True)
        if slot.event is None:
            slot.event = self.new_event()
        slot.event.record()
        return out


_POOL: PinnedPool | None = None


def to_device(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``tensor`` on ``device``: through :class:`PinnedPool` for a pageable host tensor
    going to a CUDA device, else ``tensor.to(device, non_blocking=True)``."""
    global _POOL
    device = torch.device(device)
    if device.type != "cuda" or tensor.device.type != "cpu" or tensor.is_pinned() or \
            tensor.numel() == 0:
        return tensor.to(device, non_blocking=True)
    if _POOL is None:
        _POOL = PinnedPool()
    return _POOL.copy(tensor, device)
