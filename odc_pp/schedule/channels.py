"""Which communicator carries a pipeline message, torch-free: the layout that
:func:`odc_pp.schedule.validate.check_nccl_order` simulates and that
:class:`odc_pp.runtime.p2p_channels.PipelineChannels` creates process groups for.

NCCL runs the point-to-point operations of one communicator in issue order on one stream
(a receive blocks everything queued behind it), while gloo matches by tag. A pipeline is
NCCL-safe by construction when every communicator carries traffic in one direction only:
then its FIFO is exactly the sender's issue order, which the lowering keeps per ordered
rank pair (the receiver posts its RECVs in the order of the sender's SENDs).

* ``ChannelLayout.DIRECTED`` (the runtime's layout): one process group per ordered pair of
  neighbouring pipeline ranks ``src -> dst`` (``r -> r+1`` and ``r+1 -> r``, cyclically,
  which covers interleaved wrap-around and V-shape turns); headers, payloads, single and
  batched sends of that direction all use it.
* ``ChannelLayout.SHARED`` (the old layout, kept to show why it deadlocks): one pipeline
  group for both directions; torch then runs single ops of a rank pair on one pair
  communicator (one FIFO per unordered pair) and batched ops on the group's main one.

Ranks are pipeline (group) ranks.

Communicator creation: NCCL may create a group's communicator lazily, at the first
operation a rank issues on it, and that operation then blocks the host until every
member reached its own first operation there. :class:`Communicator` names a group for
the start-up warm-up (:mod:`odc_pp.runtime.warmup`), which touches every communicator
once in :func:`warmup_order` -- one global order that every rank follows -- so no
schedule operation is ever a creation; :func:`channel_members` gives the members the
static model (:func:`odc_pp.schedule.nccl_order.check_nccl_order`) waits for.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

__all__ = ["ChannelLayout", "channel_key", "channel_members", "neighbour_pairs",
           "Communicator", "warmup_order", "channel_communicators"]


class ChannelLayout(enum.Enum):
    DIRECTED = "directed"
    SHARED = "shared"


def channel_key(layout: ChannelLayout, src: int, dst: int, *, batched: bool = False) -> tuple:
    """The communicator a message ``src -> dst`` travels on (``batched``: issued inside a
    ``batch_isend_irecv`` of more than one operation)."""
    if layout is ChannelLayout.DIRECTED:
        return ("directed", src, dst)
    if batched:
        return ("group",)
    return ("pair", min(src, dst), max(src, dst))


def neighbour_pairs(pp: int) -> list[tuple[int, int]]:
    """Ordered pipeline-rank pairs that get a directed channel, in creation order."""
    pairs: list[tuple[int, int]] = []
    for rank in range(pp):
        nxt = (rank + 1) % pp
        for pair in ((rank, nxt), (nxt, rank)):
            if pair[0] != pair[1] and pair not in pairs:
                pairs.append(pair)
    return pairs


def channel_members(key: tuple, pp: int) -> tuple[int, ...]:
    """Pipeline ranks of the communicator ``key`` (from :func:`channel_key`) of a
    pipeline of ``pp`` ranks: the ranks its creation waits for."""
    if key[0] in ("directed", "pair"):
        return tuple(sorted(key[1:]))
    return tuple(range(pp))


@dataclass(frozen=True, kw_only=True)
class Communicator:
    """One process group to create at start-up (see the module doc)."""

    ranks: tuple[int, ...]
    """Sorted global ranks of its members."""
    kind: str
    """What it carries ("p2p", "tp", "pp", "dp", ...): part of the order and messages."""
    detail: tuple[int, ...] = ()
    """Tells apart groups of the same ranks and kind (``(src, dst)`` of a channel)."""
    group: object = field(default=None, compare=False, hash=False)
    """The torch.distributed group (None in the static model)."""

    @property
    def order(self) -> tuple:
        """Sort key of the global warm-up order (equal on every member)."""
        return (self.ranks, self.kind, self.detail)

    def describe(self) -> str:
        what = f"{self.kind} {self.detail[0]}->{self.detail[1]}" \
            if self.kind == "p2p" and len(self.detail) == 2 else self.kind
        return f"{what} group of global ranks {list(self.ranks)}"


def warmup_order(communicators) -> list[Communicator]:
    """The one global order of the warm-up: by member ranks, then kind, then detail.
    Every rank sorts the communicators it belongs to by the same key, so the sequences
    of any two ranks agree on the communicators they share: no rank can wait in a
    creation for a member that waits in an earlier creation for it. Duplicates (the same
    order key twice) are refused: members could not tell which one comes first."""
    ordered = sorted(communicators, key=lambda c: c.order)
    for before, after in zip(ordered, ordered[1:]):
        if before.order == after.order:
            raise ValueError(f"two communicators share the warm-up key {after.order}: "
                             "give them distinct kinds or details")
    return ordered


def channel_communicators(ranks: list[int], *, layout: ChannelLayout = ChannelLayout.DIRECTED,
                          groups: dict | None = None,
                          shared_group=None) -> list[Communicator]:
    """The communicators one pipeline (global ``ranks`` per pipeline rank) sends on:
    one per directed channel, or its one shared group. ``groups``/``shared_group``:
    the process groups (None in the static model)."""
    if len(ranks) < 2:
        return []
    if layout is ChannelLayout.SHARED:
        return [Communicator(ranks=tuple(sorted(ranks)), kind="pp-shared",
                             group=shared_group)]
    return [Communicator(ranks=tuple(sorted((ranks[src], ranks[dst]))), kind="p2p",
                         detail=(ranks[src], ranks[dst]),
                         group=None if groups is None else groups[(src, dst)])
            for src, dst in neighbour_pairs(len(ranks))]
