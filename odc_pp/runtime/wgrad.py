"""Deferred weight-gradient work, keyed by (chunk, microbatch).

During a B action the runtime enters ``queue.deferring(chunk, microbatch)``; linear layers
bound to the queue (``odc_pp.megatron.layers``) then enqueue their weight-gradient GEMM
instead of running it, and the W action runs ``queue.flush(chunk, microbatch)``.

Transformer Engine layers (>= 2.3, ``delay_wgrad_compute=True``) keep their own FIFO of
pending wgrads and expose ``backward_dw()``; :meth:`WeightGradQueue.attach` records them
per chunk and each deferred B enqueues one ``backward_dw()`` call per TE module. Because
TE's store is FIFO per module, W actions of a chunk must then follow the chunk's B order;
the queue checks this. (Not exercised on this CPU-only box: TE is not installed.)
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from typing import Callable, Iterable

import torch

__all__ = ["WeightGradQueue"]

Key = tuple[int, int]


class WeightGradQueue:
    """Pending wgrad closures per (chunk, microbatch); owned by one runtime."""

    def __init__(self) -> None:
        self._pending: dict[Key, list[Callable[[], None]]] = defaultdict(list)
        self._active: Key | None = None
        self._te_modules: dict[int, list[torch.nn.Module]] = {}
        self._te_order: dict[int, list[int]] = defaultdict(list)

    # ----- binding ---------------------------------------------------------------
    def attach(self, chunk: int, module: torch.nn.Module) -> int:
        """Bind every deferrable layer inside ``module`` (local ``chunk``) to this queue.
        Returns how many layers were bound."""
        bound = 0
        te_modules = []
        for sub in module.modules():
            if hasattr(sub, "wgrad_queue") and hasattr(sub, "_check_deferrable"):
                sub.wgrad_queue = self
                bound += 1
            elif _delays_te_wgrad(sub):
                te_modules.append(sub)
        self._te_modules[chunk] = te_modules
        return bound + len(te_modules)

    # ----- deferral --------------------------------------------------------------
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
        te_modules = self._te_modules.get(chunk, [])
        if te_modules:
            self._te_order[chunk].append(microbatch)
            self._pending[(chunk, microbatch)].append(
                lambda: [m.backward_dw() for m in te_modules])

    def put(self, work: Callable[[], None]) -> None:
        assert self._active is not None, "put() outside deferring()"
        self._pending[self._active].append(work)

    def flush(self, chunk: int, microbatch: int) -> int:
        """Run the deferred wgrad work of (chunk, microbatch); returns how many closures."""
        works = self._pending.pop((chunk, microbatch), [])
        order = self._te_order.get(chunk)
        if order:
            if order[0] != microbatch:
                raise ValueError(
                    f"TE delayed wgrad is FIFO per module: W of chunk {chunk} must follow "
                    f"its B order (next is microbatch {order[0]}, got {microbatch})")
            order.pop(0)
        with torch.no_grad():
            for work in works:
                work()
        return len(works)

    def pending_keys(self) -> list[Key]:
        return sorted(key for key, works in self._pending.items() if works)

    def __len__(self) -> int:
        return sum(len(works) for works in self._pending.values())


def _delays_te_wgrad(module: torch.nn.Module) -> bool:
    return (callable(getattr(module, "backward_dw", None))
            and bool(getattr(module, "delay_wgrad_compute", False))
            and type(module).__module__.startswith("transformer_engine"))
