"""The process groups of the pipeline's communicator mapping.

The layout itself -- which communicator a message ``src -> dst`` travels on
(:class:`ChannelLayout`, :func:`channel_key`, :func:`neighbour_pairs`), the members a
communicator's creation waits for and the one global warm-up order
(:class:`Communicator`, :func:`warmup_order`) -- is torch-free and lives in
:mod:`odc_pp.schedule.channels`, where the static NCCL model simulates it;
:class:`PipelineChannels` holds the process groups :mod:`odc_pp.runtime.p2p` sends on.
Ranks are pipeline (group) ranks unless named ``global``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from odc_pp.schedule.channels import (ChannelLayout, Communicator, channel_communicators,
                                      channel_key, channel_members, neighbour_pairs,
                                      warmup_order)

__all__ = ["ChannelLayout", "channel_key", "channel_members", "neighbour_pairs",
           "PipelineChannels", "create_pipeline_channels", "pipeline_channels",
           "Communicator", "warmup_order", "channel_communicators"]


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
                             shared_groups: list | None = None,
                             timeout=None) -> PipelineChannels | None:
    """Create the channel groups of every pipeline (global ranks per pipeline) and return
    this process's (None if it is in none). Collective: every process of the default group
    calls it with the same arguments, since ``dist.new_group`` must be called by all, in
    the same order. SHARED reuses ``shared_groups`` (one pipeline group per pipeline).
    ``timeout``: each group's (a ``timedelta``; None: torch's default)."""
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
            groups = {pair: dist.new_group(sorted((ranks[pair[0]], ranks[pair[1]])),
                                           timeout=timeout)
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
