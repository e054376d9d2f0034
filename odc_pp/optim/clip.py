"""Global gradient norm, non-finite check and clipping: the one implementation.

Used by the synchronous step (``ShardedAdamW.clip_and_step``), by post-validation
(:mod:`odc_pp.optim.post_validation`) and by ``odc_pp.odc.ShardedAdamW``. Each step is
one function, and their order of floating-point operations is the contract (the
post-validated and synchronous paths are compared bit for bit):

1. :func:`local_sum_of_squares`: this rank's share. Each tensor is walked in pieces of at
   most :data:`SQUARES_CHUNK_ELEMENTS` elements; each piece's squares are summed in
   ``dtype`` (after converting the piece to it), and the piece sums are added in list
   order into a ``dtype`` scalar where the tensors live (no host sync per tensor), moved
   to ``device`` once. No temporary is larger than one piece (the flat fp32 gradient
   buffer of a Llama-3-8B stage is 7 GiB; squaring it whole would double it).
2. :class:`GradStateReduction`: the float64 pair (local sum, non-finite flag), built on
   the device without a host sync, is all-reduced (sum; one reduction for both) over
   each process group in turn; with several groups each rank's share must be a disjoint
   piece of the gradient whose pieces over all the groups' ranks make the whole (e.g.
   ``[data-parallel shard group, pipeline group]``). The first all-reduce starts at once
   and does not block; :meth:`GradStateReduction.wait` finishes it and runs the others,
   each wait bounded by ``timeout_s``.
3. Non-finite check: a rank whose local sum is not finite sends (0, 1) instead of
   (sum, 0). A sum of squares is non-negative term by term, so one inf/NaN element makes
   the local sum inf or NaN (no cancellation) -- the sum's finiteness is the element check.
   The global state is finite iff no rank flagged and the reduced sum is finite.
4. :func:`clip_coefficient`: ``max_norm / (norm + eps)`` in Python (float64) arithmetic,
   ``norm = sqrt(global sum)``; it is applied only when below 1 (as
   ``torch.nn.utils.clip_grad_norm_`` clamps it at 1).
5. :func:`scale_`: ``tensor.mul_(coefficient)`` in place, tensor by tensor.
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch
import torch.distributed as dist

__all__ = ["SQUARES_CHUNK_ELEMENTS", "local_sum_of_squares", "has_nonfinite", "GradState",
           "GradStateReduction", "group_list", "global_grad_state", "clip_coefficient", "scale_", "clip_"]

DEFAULT_EPS = 1e-6
"""Added to the norm in the clipping coefficient (as torch's ``clip_grad_norm_``)."""
SQUARES_CHUNK_ELEMENTS = 1 << 24
"""Elements per piece of :func:`local_sum_of_squares` (64 MiB of fp32 temporaries at
most: a few hundred kernels for a 7 GiB buffer, none of them full-size)."""


def local_sum_of_squares(tensors: Iterable[torch.Tensor], *, dtype: torch.dtype,
                         device: torch.device | str) -> torch.Tensor:
    """0-dim ``dtype`` tensor on ``device``: the sum over ``tensors`` (in order) of each
    tensor's sum of squared entries, taken in ``dtype`` piece by piece (module docstring,
    step 1): the temporaries are at most :data:`SQUARES_CHUNK_ELEMENTS` elements."""
    tensors = list(tensors)
    if not tensors:
        return torch.zeros((), dtype=dtype, device=device)
    # accumulated where the tensors live, one transfer at the end: no host sync per tensor
    total = torch.zeros((), dtype=dtype, device=tensors[0].device)
    for tensor in tensors:
        for piece in _pieces(tensor.detach()):
            total += piece.to(dtype).pow(2).sum().to(total.device)
    return total.to(device)


def _pieces(tensor: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Views of ``tensor`` of at most :data:`SQUARES_CHUNK_ELEMENTS` elements (rows of a
    non-contiguous tensor: at least one row), copying nothing."""
    if tensor.dim() <= 1 or tensor.is_contiguous():
        return tensor.reshape(-1).split(SQUARES_CHUNK_ELEMENTS)
    rows = max(1, SQUARES_CHUNK_ELEMENTS // max(1, tensor[0].numel()))
    return tensor.split(rows)


def has_nonfinite(tensors: Iterable[torch.Tensor]) -> bool:
    """True if any entry of any tensor is inf or NaN."""
    return any(not bool(torch.isfinite(tensor).all()) for tensor in tensors)


@dataclass(frozen=True)
class GradState:
    """The global gradient state after the reduction."""

    norm_sq: float
    """Sum of squared gradient entries over all ranks (0.0 when not finite)."""
    finite: bool
    """No gradient entry on any rank was inf or NaN (and the sum did not overflow)."""

    @property
    def norm(self) -> float:
        """Global L2 norm; inf when not finite."""
        return math.sqrt(self.norm_sq) if self.finite else math.inf


def group_list(groups) -> list:
    """``groups`` (one process group, None for WORLD, or a sequence) as a non-empty list."""
    groups = list(groups) if isinstance(groups, (list, tuple)) else [groups]
    if not groups:
        raise ValueError("groups: give a process group, None (WORLD) or a non-empty list")
    return groups


class GradStateReduction:
    """All-reduce of (local sum of squares, non-finite flag) over ``groups`` in turn
    (module docstring, steps 2-3). Constructing it starts the first all-reduce
    without waiting; :meth:`wait` returns the :class:`GradState`."""

    def __init__(self, local_norm_sq: torch.Tensor | float, groups, *,
                 device: torch.device | str, timeout_s: float) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.groups = group_list(groups)
        self.timeout_s = timeout_s
        # (sum, 0) or (0, 1), built on the device: no host sync before the reduction
        value = torch.as_tensor(local_norm_sq).detach().to(device=device, dtype=torch.float64)
        finite = torch.isfinite(value)
        self._state = torch.stack([torch.where(finite, value, torch.zeros_like(value)),
                                   (~finite).to(torch.float64)]).reshape(2)
        self._work = dist.all_reduce(self._state, group=self.groups[0], async_op=True)

    def wait(self) -> GradState:
        """Finish the reductions (blocking); each one raises TimeoutError after
        ``timeout_s``."""
        if self._work is None:
            raise ValueError("GradStateReduction.wait() was already called")
        work, self._work = self._work, None
        self._wait(work, 0)
        for index, group in enumerate(self.groups[1:], start=1):
            self._wait(dist.all_reduce(self._state, group=group, async_op=True), index)
        norm_sq, flagged = self._state.tolist()
        finite = flagged == 0 and math.isfinite(norm_sq)
        return GradState(norm_sq=norm_sq if finite else 0.0, finite=finite)

    def _wait(self, work, index: int) -> None:
        if work.wait(timeout=datetime.timedelta(seconds=self.timeout_s)) is False:
            raise TimeoutError(f"global gradient norm: all-reduce {index + 1} of "
                               f"{len(self.groups)} did not complete within "
                               f"{self.timeout_s}s (a peer rank stopped or is late)")


def global_grad_state(local_norm_sq: torch.Tensor | float, groups, *,
                      device: torch.device | str, timeout_s: float) -> GradState:
    """:class:`GradStateReduction` started and waited for at once."""
    return GradStateReduction(local_norm_sq, groups, device=device,
                              timeout_s=timeout_s).wait()


def clip_coefficient(norm: float, max_norm: float, eps: float = DEFAULT_EPS) -> float:
    """``max_norm / (norm + eps)``: the factor that brings ``norm`` to ``max_norm``;
    clip only when it is below 1."""
    return max_norm / (norm + eps)


@torch.no_grad()
def scale_(tensors: Iterable[torch.Tensor], coefficient: float) -> None:
    """Multiply every tensor in place by ``coefficient``."""
    for tensor in tensors:
        tensor.mul_(coefficient)


def clip_(tensors: Sequence[torch.Tensor], state: GradState, max_norm: float,
          eps: float = DEFAULT_EPS) -> bool:
    """Scale ``tensors`` (this rank's gradients) so the global norm of ``state`` is at
    most ``max_norm``; True if they were scaled. A non-finite state leaves them as they
    are (the step must be skipped instead)."""
    if not max_norm > 0:
        raise ValueError(f"max_norm must be > 0, got {max_norm}")
    if not state.finite:
        return False
    coefficient = clip_coefficient(state.norm, max_norm, eps)
    if coefficient >= 1.0:
        return False
    scale_(tensors, coefficient)
    return True
