"""Variable context parallelism's slots (``--dynamic-context-parallel``,
docs/context_parallel.md): a replica's packed rows become slots that every one of its N
context-parallel *lanes* runs in the same order.

* a **CP slot**: a row holding a document longer than one lane's budget (``lane_tokens``,
  the row capacity / N) -- split over the N lanes as static CP does;
* a **lane slot**: N rows of at most ``lane_tokens`` tokens, one per lane, each run on its
  lane alone (no ring). The samples of the replica's other rows are packed again into
  such rows (first fit by decreasing length, ties by sample id) and bundled N at a time;
  the last bundle's missing rows are empty (padding, no loss).

Every lane plans the same slots from the replica's rows and the sample lengths alone, so
the slots (and the schedule over them) agree on every lane without communication."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable, Sequence

from .load_balance import pack_microbatches

__all__ = ["Slot", "lane_slots", "slots_digest"]


@dataclass(frozen=True)
class Slot:
    """One microbatch slot of every lane of a replica."""

    groups: tuple[tuple[int, ...], ...]
    """CP slot: one group (the row's sample ids), split over the lanes; lane slot: one
    group per lane (empty: an empty row)."""
    split: bool
    """A CP slot (split over the lanes) rather than a lane slot."""


def lane_slots(rows: Sequence[Sequence[int]], length: Callable[[int], int], *, lanes: int,
               lane_tokens: int) -> list[Slot]:
    """The slots of a replica whose packed rows are ``rows`` (sample ids); ``length(id)``:
    a sample's tokens. CP slots first, in the rows' order, then the lane slots."""
    if lanes < 2:
        raise ValueError(f"lane slots need at least 2 lanes, got {lanes}")
    if lane_tokens < 1:
        raise ValueError(f"lane_tokens must be >= 1, got {lane_tokens}")
    split = [tuple(row) for row in rows if max(length(i) for i in row) > lane_tokens]
    short = sorted(i for row in rows if max(length(i) for i in row) <= lane_tokens
                   for i in row)
    # first fit by decreasing length, ties by sample id: the packer LB-Mini uses
    bins = [[short[k] for k in b] for b in pack_microbatches(
        range(len(short)), [length(i) for i in short], lane_tokens)]
    slots = [Slot(groups=(row,), split=True) for row in split]
    for start in range(0, len(bins), lanes):
        bundle = [tuple(b) for b in bins[start:start + lanes]]
        bundle += [()] * (lanes - len(bundle))
        slots.append(Slot(groups=tuple(bundle), split=False))
    return slots


def slots_digest(slots: Sequence[Slot]) -> str:
    """sha256 of the slots (kinds and sample ids): the same plan gives the same digest."""
    text = ";".join(f"{int(slot.split)}:{slot.groups}" for slot in slots)
    return hashlib.sha256(text.encode()).hexdigest()
