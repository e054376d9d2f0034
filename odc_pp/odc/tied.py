"""Tied parameters across units or ranks of a :class:`~odc_pp.odc.engine.ShardedDataParallel`
(an embedding and its output-layer copy on another pipeline stage).

After the minibatch's sync the owned accumulators hold each copy's summed gradient.
:meth:`TiedGradients.sum` adds the copies' owned pieces into one full-size fp32 buffer
(each element taken once per copy, from its owner), all-reduces it over the tie group
(every rank holding a copy), and writes the sum back into every copy's owned range: the
copies get the same gradient and, AdamW being elementwise, the same update, so they stay
bitwise equal. :meth:`TiedGradients.differing` checks that they are (at every save).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.distributed as dist

from .shard_map import param_pieces

__all__ = ["TiedGradients"]


class TiedGradients:
    """The tied copies one rank holds: ``(unit, position in the unit)``, and the group."""

    def __init__(self, units, params: Sequence[tuple[int, str]],
                 group: dist.ProcessGroup | None) -> None:
        """``units``: the engine's units; ``params``: ``(unit index, parameter name in
        the unit)`` of the copies on this rank (at least one); ``group``: the ranks
        holding copies (None: all copies are on this rank)."""
        self.entries = []
        for index, name in params:
            unit = units[index]
            if name not in unit.names:
                raise ValueError(f"tied parameter {name!r} is not a trainable parameter of "
                                 f"unit {index}")
            self.entries.append((unit, unit.names.index(name)))
        if not self.entries:
            raise ValueError("a rank of the tie group holds no tied parameter")
        shapes = {unit.shapes[position] for unit, position in self.entries}
        if len(shapes) > 1:
            raise ValueError(f"tied parameters have different shapes {sorted(shapes)}")
        self.numel = math.prod(shapes.pop())
        self.group = group

    @staticmethod
    def _overlap(unit, position: int) -> tuple[slice, slice]:
        """(slice of the parameter, slice of the owned accumulator) this rank owns."""
        pieces = param_pieces(unit.owned, unit.offsets[position],
                              unit.params[position].numel())
        if len(pieces) > 1:  # a parameter lies in one segment, so in one owned piece
            raise ValueError(f"tied parameter {unit.names[position]!r} is owned in "
                             f"{len(pieces)} pieces; it must lie in one shard span")
        low, high, at = pieces[0] if pieces else (0, 0, 0)
        return slice(low, high), slice(at, at + high - low)

    @torch.no_grad()
    def sum(self) -> None:
        """Every copy's owned gradient becomes the sum over all copies."""
        device = self.entries[0][0].grad_acc.device
        total = torch.zeros(self.numel, dtype=torch.float32, device=device)
        for unit, position in self.entries:
            piece, owned = self._overlap(unit, position)
            total[piece] += unit.grad_acc[owned]
        if self.group is not None:
            dist.all_reduce(total, group=self.group)
        for unit, position in self.entries:
            piece, owned = self._overlap(unit, position)
            unit.grad_acc[owned] = total[piece]

    @torch.no_grad()
    def differing(self, owned: Sequence[torch.Tensor], window: int = 1 << 24) -> float:
        """Max abs difference between the embedding and its output-layer copy (0.0: bitwise
        equal). ``owned``: per unit, the owned elements to compare (the optimizer's fp32
        master weights). Each copy is assembled from its owners' pieces ``window`` elements
        at a time (a bounded buffer; every element owned once per copy, zeros elsewhere:
        the sum over the tie group is exact). Collective over the tie group; ranks holding
        both copies compare locally."""
        device = self.entries[0][0].grad_acc.device
        worst = 0.0
        for low in range(0, self.numel, window):
            high = min(self.numel, low + window)
            copies = torch.zeros(2, high - low, dtype=torch.float32, device=device)
            for unit, position in self.entries:
                piece, shard = self._overlap(unit, position)
                first, last = max(piece.start, low), min(piece.stop, high)
                if first < last:
                    which = 0 if "embedding" in unit.names[position] else 1
                    at = shard.start - piece.start
                    copies[which, first - low:last - low] += \
                        owned[unit.index][first + at:last + at].float()
            if self.group is not None:
                dist.all_reduce(copies, group=self.group)
            worst = max(worst, float((copies[0] - copies[1]).abs().max()))
        return worst
