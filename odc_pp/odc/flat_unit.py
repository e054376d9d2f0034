"""One unit of :class:`~odc_pp.odc.engine.ShardedDataParallel` on this rank: its trainable
parameters flattened into one buffer, this rank's shard of it (the symmetric parameter
shard and fp32 gradient accumulator peers read and add into) and the segments the
gathered parameters live in (:mod:`odc_pp.odc.residency`). See the engine's docstring
for the layout."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Sequence

import torch
from torch import nn

from . import primitives as prim
from .residency import Segment, plan_segments
from .shard_map import Piece, ShardMap, owned_numel

__all__ = ["FlatUnit"]


class FlatUnit:
    """Flat-buffer bookkeeping of one unit (module) on this rank: its parameters' offsets
    in the flat buffer, the owned shard (parameters and fp32 gradient accumulator, both
    symmetric), the gathered segments and the local ``main_grad``."""

    def __init__(self, index: int, module: nn.Module, params: list[nn.Parameter],
                 names: list[str], group, dtype: torch.dtype, device: torch.device,
                 residency_modules: Sequence[nn.Module] = ()) -> None:
        self.index = index
        self.module = module
        self.params = params
        self.names = names
        self.shapes = [tuple(p.shape) for p in params]
        self.offsets = []
        offset = 0
        for p in params:
            self.offsets.append(offset)
            offset += p.numel()
        self.numel = offset
        self.aliased = group.world_size == 1
        """dp=1: the gathered parameters are the shard itself (never released)."""
        ranges = ([] if self.aliased else
                  plan_segments(params, self.offsets, self.numel, residency_modules))
        self.map = ShardMap(self.numel, group.world_size,
                            [(lo, hi) for lo, hi, _, _ in ranges] if residency_modules else None)
        """Which flat elements each rank owns (odc_pp.odc.shard_map): with residency
        modules (layer residency) every segment is sharded over all ranks on its own."""
        self.owned: list[Piece] = self.map.pieces(group.rank)
        """This rank's ``(flat_lo, flat_hi, shard_lo)`` pieces."""
        self.shard_numel = self.map.shard_numel
        self.param_shard = prim.symmetric_empty((self.shard_numel,), dtype, group, device)
        self.grad_acc = prim.symmetric_empty((self.shard_numel,), torch.float32, group, device)
        self.segments: list[Segment] = []
        """Separately released ranges of the flat buffer (odc_pp.odc.residency)."""
        if self.aliased:
            self.segments.append(Segment(lo=0, hi=self.numel, nbytes=0,
                                         buffer=self.param_shard[:self.numel]))
        else:
            for lo, hi, part, backward in ranges:
                buffer = torch.empty(hi - lo, dtype=dtype, device=device)
                self.segments.append(Segment(lo=lo, hi=hi, buffer=buffer, module=part,
                                             backward=backward,
                                             nbytes=buffer.untyped_storage().nbytes()))
        self.main_grad: torch.Tensor | None = None
        """grad_accumulation 'local': gradient of the whole unit (main_grad_dtype), summed over the
        minibatch's microbatches (at dp=1 a view of ``grad_acc``); None: 'push'."""
        self.prefetch: Future | prim.Work | None = None
        """Pending prefetch: a helper-thread Future (CPU) or an async gather Work (CUDA)."""
        self.pushes = 0
        self.accumulated: set[int] = set()

    @property
    def owned_numel(self) -> int:
        """Shard positions ``[0, n)`` holding the owned elements (and padding between)."""
        return owned_numel(self.owned)

    @property
    def kept_nbytes(self) -> int:
        """Bytes gathered from first use to the step (without the per-layer segments)."""
        return sum(segment.nbytes for segment in self.segments if segment.module is None)

    @property
    def resident(self) -> bool:
        return all(segment.resident for segment in self.segments)

    def flat(self, offset: int, numel: int) -> torch.Tensor:
        """The gathered values of flat elements ``[offset, offset + numel)`` (one segment)."""
        for segment in self.segments:
            if segment.lo <= offset and offset + numel <= segment.hi:
                return segment.buffer[offset - segment.lo:offset - segment.lo + numel]
        raise ValueError(f"flat range [{offset}, {offset + numel}) spans segments")

    def point_params(self) -> None:
        """Make every parameter a view of its segment's buffer."""
        with torch.no_grad():
            for param, offset, shape in zip(self.params, self.offsets, self.shapes):
                param.data = self.flat(offset, param.numel()).view(shape)

    def flat_grad(self) -> torch.Tensor:
        """This rank's gradient of the whole unit as one flat tensor (zeros where missing)."""
        pieces = [p.grad.reshape(-1) if p.grad is not None
                  else torch.zeros(p.numel(), dtype=self.param_shard.dtype,
                                   device=self.param_shard.device)
                  for p in self.params]
        return torch.cat(pieces).to(self.param_shard.dtype)

    def clear_grads(self) -> None:
        for p in self.params:
            p.grad = None
        self.accumulated.clear()
