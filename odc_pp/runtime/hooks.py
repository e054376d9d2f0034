"""The contract between the pipeline runtime and a data-parallel engine.

The runtime owns the order of compute; a data-parallel engine (odc_pp.odc) owns where
parameters and gradients live. The runtime opens and closes each minibatch through these
hooks and calls them around every compute action of the schedule it executes, so a
sharded engine can gather a chunk's parameters just in time and push weight gradients to
their owners right after each W (or BW) action.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["StageDataParallel", "NoDataParallel"]


@runtime_checkable
class StageDataParallel(Protocol):
    def begin_minibatch(self, *, max_microbatches: int | None = None,
                        num_microbatches: int | None = None) -> None:
        """A minibatch of ``num_microbatches`` starts (``max_microbatches``: the largest
        count of any replica); called by the runtime before its first action."""

    def before_forward(self, chunk: int, microbatch: int) -> None:
        """Full parameters of local ``chunk`` must be usable when this returns."""

    def before_backward(self, chunk: int, microbatch: int) -> None:
        """Called before B or BW of (chunk, microbatch); parameters must be usable."""

    def after_weight_grad(self, chunk: int, microbatch: int) -> None:
        """Weight gradients of (chunk, microbatch) are complete in the chunk's ``.grad``
        (after W or BW). The engine may push and zero them."""

    def finish_minibatch(self) -> None:
        """Every action of the minibatch has run; afterwards the gradients the optimizer
        reads (local or sharded) are final. The one data-parallel wait per minibatch."""


class NoDataParallel:
    """Data-parallel size 1: gradients stay in ``.grad``; nothing to gather or push."""

    def begin_minibatch(self, *, max_microbatches: int | None = None,
                        num_microbatches: int | None = None) -> None:
        pass

    def before_forward(self, chunk: int, microbatch: int) -> None:
        pass

    def before_backward(self, chunk: int, microbatch: int) -> None:
        pass

    def after_weight_grad(self, chunk: int, microbatch: int) -> None:
        pass

    def finish_minibatch(self) -> None:
        pass
