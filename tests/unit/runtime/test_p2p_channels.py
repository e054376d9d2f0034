"""The communicator layout (plain logic; the groups themselves are exercised by the
multi-process runtime tests)."""

import pytest

from odc_pp.runtime.p2p_channels import (ChannelLayout, PipelineChannels, channel_key,
                                         neighbour_pairs)


def test_neighbour_pairs_cover_both_directions_and_the_wrap_once():
    assert neighbour_pairs(1) == []
    assert neighbour_pairs(2) == [(0, 1), (1, 0)]
    pairs = neighbour_pairs(4)
    assert sorted(pairs) == sorted({(r, (r + 1) % 4) for r in range(4)}
                                   | {((r + 1) % 4, r) for r in range(4)})
    assert len(pairs) == len(set(pairs)) == 8


def test_directed_keys_separate_directions_shared_keys_do_not():
    assert channel_key(ChannelLayout.DIRECTED, 0, 1) != channel_key(ChannelLayout.DIRECTED,
                                                                     1, 0)
    assert channel_key(ChannelLayout.DIRECTED, 0, 1, batched=True) == \
        channel_key(ChannelLayout.DIRECTED, 0, 1)
    assert channel_key(ChannelLayout.SHARED, 0, 1) == channel_key(ChannelLayout.SHARED, 1, 0)
    assert channel_key(ChannelLayout.SHARED, 0, 1, batched=True) != \
        channel_key(ChannelLayout.SHARED, 0, 1)


def test_channels_reject_non_neighbours_and_bad_ranks():
    channels = PipelineChannels(ranks=[4, 5, 6], groups={(0, 1): "g01", (1, 0): "g10"})
    assert channels.group(0, 1) == "g01" and channels.group(1, 0) == "g10"
    assert channels.global_rank(2) == 6
    with pytest.raises(ValueError, match="no channel from pipeline rank 0 to 2"):
        channels.group(0, 2)
    with pytest.raises(ValueError, match="distinct"):
        PipelineChannels(ranks=[1, 1])
    with pytest.raises(ValueError, match="shared_group"):
        PipelineChannels(ranks=[0, 1], layout=ChannelLayout.SHARED)
