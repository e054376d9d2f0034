"""Which elements of a unit's flat parameter buffer each data-parallel rank owns, and where
they lie in its shard: the one mapping between owned (shard) and flat positions.

A unit's flat buffer ``[0, numel)`` is cut into *spans*, each sharded over the ``world``
ranks on its own: span ``[lo, hi)`` is padded to ``world * chunk`` elements, ``chunk =
ceil((hi - lo) / world)``, and rank r owns its elements ``[lo + r * chunk, lo + (r + 1) *
chunk)`` (clipped to ``hi``) at shard positions ``[base, base + chunk)``, ``base`` the
chunks of the earlier spans. A span's shard offset is thus the same on every rank; the
shard holds ``sum(chunk)`` elements, the padding (a span's tail past ``hi``) zero.

* One span (``minibatch`` residency, the default): rank r owns the contiguous range
  ``shard_range(numel, r, world)`` at shard position 0, as before.
* One span per residency segment (``layer`` residency, :mod:`odc_pp.odc.residency`):
  every rank owns about ``1/world`` of every layer, so a layer's gather reads from all
  ranks (all links), not from the one or two that own its range of a contiguous cut.

A span's gradient is pushed with one ``scatter_accumulate`` into the owners' accumulator
views at its base (:meth:`ShardMap.split`: no copy). Everything that maps owned elements
to parameters (the optimizer's masks, tied
gradients, model statistics, checkpoint layouts) goes through :meth:`ShardMap.owned_in`
(or :func:`owned_in` on recorded ``(flat_lo, flat_hi, shard_lo)`` pieces).
"""

from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["Piece", "ShardMap", "owned_in", "owned_numel", "param_pieces"]

Piece = tuple[int, int, int]
"""``(flat_lo, flat_hi, shard_lo)``: flat elements ``[flat_lo, flat_hi)`` lie at shard
positions ``[shard_lo, shard_lo + flat_hi - flat_lo)``."""


class ShardMap:
    """The spans of one unit's flat buffer over ``world`` ranks (module docstring).
    ``spans``: ``(lo, hi)`` ranges covering ``[0, numel)`` in order; None: one span."""

    def __init__(self, numel: int, world: int, spans: Sequence[tuple[int, int]] | None = None
                 ) -> None:
        if world <= 0 or numel < 0:
            raise ValueError(f"ShardMap needs world > 0 and numel >= 0, got world={world}, "
                             f"numel={numel}")
        spans = [(0, numel)] if not spans else [(lo, hi) for lo, hi in spans if hi > lo]
        position = 0
        for lo, hi in spans:
            if lo != position:
                raise ValueError(f"shard spans must cover [0, {numel}) in order; a span "
                                 f"starts at {lo}, expected {position}")
            position = hi
        if position != numel:
            raise ValueError(f"shard spans end at {position}, the unit has {numel} elements")
        self.numel = numel
        self.world = world
        self.spans: list[tuple[int, int, int, int]] = []
        """``(lo, hi, chunk, base)`` per span."""
        base = 0
        for lo, hi in spans:
            chunk = -(-(hi - lo) // world)
            self.spans.append((lo, hi, chunk, base))
            base += chunk
        self.shard_numel = max(base, -(-numel // world))
        """Elements of every rank's shard (its padding included)."""

    @property
    def contiguous(self) -> bool:
        """One span: every rank owns one contiguous range of the flat buffer."""
        return len(self.spans) <= 1

    def pieces(self, rank: int) -> list[Piece]:
        """``rank``'s owned ``(flat_lo, flat_hi, shard_lo)`` pieces, in flat order."""
        out = []
        for lo, hi, chunk, base in self.spans:
            first = lo + rank * chunk
            last = min(hi, first + chunk)
            if first < last:
                out.append((first, last, base))
        return out

    def owned_numel(self, rank: int) -> int:
        """Shard positions ``[0, n)`` that hold ``rank``'s owned elements (and the padding
        between them; zero where nothing is owned)."""
        return owned_numel(self.pieces(rank))

    def owned_in(self, rank: int, lo: int, hi: int) -> list[Piece]:
        """The pieces of flat range ``[lo, hi)`` that ``rank`` owns."""
        return owned_in(self.pieces(rank), lo, hi)

    def split(self, shard: torch.Tensor, flat: torch.Tensor
              ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``(shard part, flat part)`` per span: ``shard[base:base + chunk]`` (a view, at
        the same offset on every rank) and ``flat[lo:hi]``, whose ``shard_range`` cut over
        the ranks is the span's ownership -- what ``scatter_accumulate`` (and
        ``gather_into_tensor``) take. ``shard``: ``shard_numel`` elements; ``flat``:
        ``numel``."""
        if self.contiguous:
            return [(shard, flat)]
        return [(shard[base:base + chunk], flat[lo:hi]) for lo, hi, chunk, base in self.spans]


def owned_in(pieces: Sequence[Sequence[int]], lo: int, hi: int) -> list[Piece]:
    """The parts of flat range ``[lo, hi)`` inside owned ``pieces`` (``(flat_lo, flat_hi,
    shard_lo)``, e.g. a checkpoint's recorded layout), as pieces."""
    out = []
    for first, last, at in pieces:
        a, b = max(lo, first), min(hi, last)
        if a < b:
            out.append((a, b, at + a - first))
    return out


def owned_numel(pieces: Sequence[Sequence[int]]) -> int:
    """Shard positions ``[0, n)`` that hold owned ``pieces`` (and the padding between)."""
    return max((at + hi - lo for lo, hi, at in pieces), default=0)


def param_pieces(pieces: Sequence[Sequence[int]], offset: int, numel: int
                 ) -> list[tuple[int, int, int]]:
    """The owned parts of the parameter at flat ``offset`` (``numel`` elements) as
    ``(param_lo, param_hi, shard_lo)``: its elements ``[param_lo, param_hi)`` lie at shard
    positions from ``shard_lo``."""
    return [(lo - offset, hi - offset, at)
            for lo, hi, at in owned_in(pieces, offset, offset + numel)]
