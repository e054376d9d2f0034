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
"""

from __future__ import annotations

import enum

__all__ = ["ChannelLayout", "channel_key", "neighbour_pairs"]


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
