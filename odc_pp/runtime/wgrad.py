"""Deferred weight-gradient work, keyed by (chunk, microbatch).

During a B action the runtime enters ``queue.deferring(chunk, microbatch)``; linear layers
bound to the queue (``odc_pp.megatron.layers``) then enqueue their weight-gradient GEMM
instead of running it, and the W action runs ``queue.flush(chunk, microbatch)``.
A BW action does not defer: each weight gradient is computed inside the backward, the
same arithmetic as the deferred closure (nothing is queued, nothing held for a W).
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from typing import Callable

import torch

__all__ = ["WeightGradQueue"]

Key = tuple[int, int]


class WeightGradQueue:
    """Pending wgrad closures per (chunk, microbatch); owned by the chunks' one runtime."""

    def __init__(self) -> None:
        self._pending: dict[Key, list[Callable[[], None]]] = defaultdict(list)
        self._active: Key | None = None
        self.bound_layers: dict[int, int] = {}
        """Deferrable layers bound per local chunk (0: that chunk's wgrads stay in B)."""
        self._layers: list[torch.nn.Module] = []
        self.held_bytes: dict[Key, int] = defaultdict(int)
        """Bytes of non-parameter tensors (saved inputs, output gradients) the deferred
        work of each (chunk, microbatch) holds from its B to its W; the profiler turns
        them into the B/W memory deltas. Cleared by ``reset_held_bytes``."""

    def attach(self, chunk: int, module: torch.nn.Module) -> int:
        """Bind every deferrable layer inside ``module`` (local ``chunk``) to this queue;
        returns how many. A PipelineRuntime binds its chunks once, when it is built: one
        runtime (and queue) per set of chunks, whatever schedules it runs."""
        bound = 0
        for sub in module.modules():
            if hasattr(sub, "wgrad_queue") and hasattr(sub, "native_autograd"):
                sub.wgrad_queue = self
                self._layers.append(sub)
                bound += 1
        self.bound_layers[chunk] = bound
        return bound

    def claim(self) -> None:
        """Bind the layers ``attach`` bound back to this queue if a later runtime built on
        the same chunks took them (each runtime claims its chunks when a minibatch
        starts; otherwise its B would run the weight gradients at once, into the other
        runtime's idle queue, and its W would find nothing to run)."""
        if self._layers and self._layers[0].wgrad_queue is not self:
            for layer in self._layers:
                layer.wgrad_queue = self

    @property
    def is_deferring(self) -> bool:
        return self._active is not None

    @contextlib.contextmanager
    def deferring(self, chunk: int, microbatch: int):
        """Within this block, bound layers enqueue their wgrad under (chunk, microbatch)."""
        assert self._active is None, "nested deferral"
        self._active = (chunk, microbatch)
        try:
            yield
        finally:
            self._active = None

    def put(self, work: Callable[[], None]) -> None:
        assert self._active is not None, "put() outside deferring()"
        self._pending[self._active].append(work)
        self.held_bytes[self._active] += _tensor_bytes(work)

    def pending_bytes(self, chunk: int, microbatch: int) -> int:
        """Bytes the still-queued work of (chunk, microbatch) holds (0 once flushed)."""
        key = (chunk, microbatch)
        return self.held_bytes.get(key, 0) if self._pending.get(key) else 0

    def reset_held_bytes(self) -> None:
        self.held_bytes.clear()

    def flush(self, chunk: int, microbatch: int) -> int:
        """Run the deferred wgrad work of (chunk, microbatch); returns how many closures."""
        works = self._pending.pop((chunk, microbatch), [])
        with torch.no_grad():
            for work in works:
                work()
        return len(works)

    def pending_keys(self) -> list[Key]:
        return sorted(key for key, works in self._pending.items() if works)

    def __len__(self) -> int:
        return sum(len(works) for works in self._pending.values())


def _tensor_bytes(work) -> int:
    """Bytes of the distinct non-parameter tensors a ``functools.partial`` (or closure)
    holds."""
    objects = list(getattr(work, "args", ())) + list(getattr(work, "keywords", {}).values())
    objects += [cell.cell_contents for cell in (getattr(work, "__closure__", None) or ())]
    seen, total = set(), 0
    for obj in objects:
        if isinstance(obj, torch.Tensor) and not isinstance(obj, torch.nn.Parameter):
            # the storage's identity, not its address: fake tensors (the memory dry run)
            # all have address 0
            key = (obj.untyped_storage()._cdata, obj.storage_offset(), tuple(obj.shape))
            if key not in seen:
                seen.add(key)
                total += obj.numel() * obj.element_size()
    return total
