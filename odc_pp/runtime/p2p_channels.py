"""The one owner of the pipeline's communicator mapping.

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

:func:`channel_key` is what :mod:`odc_pp.schedule.validate` simulates and
:class:`PipelineChannels` is what :mod:`odc_pp.runtime.p2p` sends on; both read the layout
from here. Ranks are pipeline (group) ranks unless named ``global``.

Communicator creation: NCCL may create a group's communicator lazily, at the first
operation a rank issues on it, and that operation then blocks the host until every
member reached its own first operation there. :class:`Communicator` names a group for
the start-up warm-up (:mod:`odc_pp.runtime.warmup`), which touches every communicator
once in :func:`warmup_order` -- one global order that every rank follows -- so no
schedule operation is ever a creation; :func:`channel_members` gives the members the
static model (:func:`odc_pp.schedule.validate.check_nccl_order`) waits for.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

__all__ = ["ChannelLayout", "channel_key", "channel_members", "neighbour_pairs",
           "PipelineChannels", "create_pipeline_channels", "pipeline_channels",
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


def neighbour_pairs(pp: int) -> list[tuple[int, int]]:
    """Ordered pipeline-rank pairs that get a directed channel, in creation order."""
    pairs: list[tuple[int, int]] = []
    for rank in range(pp):
        nxt = (rank + 1) % pp
        for pair in ((rank, nxt), (nxt, rank)):
            if pair[0] != pair[1] and pair not in pairs:
                pairs.append(pair)
    return pairs


@dataclass(kw_only=True)
class PipelineChannels:
    """The process groups one pipeline's point-to-point traffic uses."""

    ranks: list[int]
    """Global rank of each pipeline rank."""
    layout: ChannelLayout = ChannelLayout.DIRECTED
    """How messages map to communicators (see the module doc)."""
    groups: dict[tuple[int, int], object] = field(default_factory=dict)
    """DIRECTED: (src, dst) pipeline ranks -> process group carrying only src -> dst."""
    shared_group: object = None
    """SHARED: the one pipeline group of both directions."""

    def __post_init__(self) -> None:
        if len(set(self.ranks)) != len(self.ranks) or not self.ranks:
            raise ValueError(f"pipeline ranks must be distinct and non-empty: {self.ranks}")
        if self.layout is ChannelLayout.SHARED and self.shared_group is None \
                and len(self.ranks) > 1:
            raise ValueError("ChannelLayout.SHARED needs shared_group")

    def group(self, src: int, dst: int):
        """Process group of the message ``src -> dst`` (pipeline ranks)."""
        if self.layout is ChannelLayout.SHARED:
            return self.shared_group
        try:
            return self.groups[(src, dst)]
        except KeyError:
            raise ValueError(f"no channel from pipeline rank {src} to {dst}: only neighbours "
                             f"(r -> r+-1 mod pp) communicate") from None

    def global_rank(self, rank: int) -> int:
        return self.ranks[rank]

    def communicators(self) -> list[Communicator]:
        """This pipeline's communicators, for the start-up warm-up."""
        return channel_communicators(self.ranks, layout=self.layout, groups=self.groups,
                                     shared_group=self.shared_group)


def create_pipeline_channels(pipelines: list[list[int]], *,
                             layout: ChannelLayout = ChannelLayout.DIRECTED,
                             shared_groups: list | None = None) -> PipelineChannels | None:
    """Create the channel groups of every pipeline (global ranks per pipeline) and return
    this process's (None if it is in none). Collective: every process of the default group
    calls it with the same arguments, since ``dist.new_group`` must be called by all, in
    the same order. SHARED reuses ``shared_groups`` (one pipeline group per pipeline)."""
    import torch.distributed as dist

    me = dist.get_rank()
    mine = None
    for index, ranks in enumerate(pipelines):
        if layout is ChannelLayout.SHARED:
            if shared_groups is None:
                raise ValueError("ChannelLayout.SHARED needs shared_groups")
            channels = PipelineChannels(ranks=list(ranks), layout=layout,
                                        shared_group=shared_groups[index])
        else:
            groups = {pair: dist.new_group(sorted((ranks[pair[0]], ranks[pair[1]])))
                      for pair in neighbour_pairs(len(ranks))}
            channels = PipelineChannels(ranks=list(ranks), layout=layout, groups=groups)
        if me in ranks:
            mine = channels
    return mine


def pipeline_channels(pp_group, *, layout: ChannelLayout = ChannelLayout.DIRECTED
                      ) -> PipelineChannels:
    """Channels of a single pipeline that spans the whole default group (tests,
    single-pipeline tools). Collective over the default group."""
    import torch.distributed as dist

    ranks = dist.get_process_group_ranks(pp_group)
    if len(ranks) != dist.get_world_size():
        raise ValueError("pipeline_channels derives channels only for a pipeline spanning "
                         "every process; with several pipelines call "
                         "create_pipeline_channels(all pipelines) on every rank")
    return create_pipeline_channels([ranks], layout=layout, shared_groups=[pp_group])
