"""odc_pp.odc.shard_map: one span is the contiguous cut of ``shard_range``; several spans
(layer residency) give every rank about ``1/world`` of each span, every element owned
once, at the same shard offset on every rank, and ``split`` hands scatter_accumulate
each element where its owner's pieces say."""

from __future__ import annotations

import pytest
import torch

from odc_pp.odc.primitives import shard_range
from odc_pp.odc.shard_map import ShardMap, owned_in, owned_numel, param_pieces


@pytest.mark.parametrize("numel,world", [(10, 3), (7, 2), (5, 8), (12, 4)])
def test_one_span_is_the_contiguous_cut(numel, world):
    shard_map = ShardMap(numel, world)
    assert shard_map.contiguous and shard_map.shard_numel == -(-numel // world)
    for rank in range(world):
        start, end = shard_range(numel, rank, world)
        assert shard_map.pieces(rank) == ([(start, end, 0)] if end > start else [])
        assert shard_map.owned_numel(rank) == end - start
    flat, shard = torch.arange(numel, dtype=torch.float32), torch.zeros(-(-numel // world))
    ((shard_part, flat_part),) = shard_map.split(shard, flat)
    assert shard_part is shard and flat_part is flat


@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_span_is_sharded_over_all_ranks(world):
    spans = [(0, 5), (5, 82), (82, 159), (159, 160), (160, 171)]
    shard_map = ShardMap(171, world, spans)
    owners = torch.zeros(171, dtype=torch.long)
    flat = torch.arange(1, 172, dtype=torch.float32)
    # what scatter_accumulate does with each (shard part, flat part): rank r's accumulator
    # part += flat part[shard_range(r)]
    ordered = torch.zeros(world, shard_map.shard_numel)
    for rank in range(world):
        for shard_part, flat_part in shard_map.split(ordered[rank], flat):
            start, end = shard_range(flat_part.numel(), rank, world)
            shard_part[:end - start] += flat_part[start:end]
    for rank in range(world):
        pieces = shard_map.pieces(rank)
        for lo, hi, at in pieces:
            owners[lo:hi] += 1
            assert torch.equal(ordered[rank, at:at + hi - lo], flat[lo:hi])
        for lo, hi in spans:
            mine = sum(b - a for a, b, _ in owned_in(pieces, lo, hi))
            chunk = -(-(hi - lo) // world)  # every rank: about 1/world of it
            assert max(0, hi - lo - (world - 1) * chunk) <= mine <= chunk
        assert owned_numel(pieces) <= shard_map.shard_numel
    assert bool((owners == 1).all())  # every element owned once
    assert int((ordered != 0).sum()) == 171  # the rest is padding (zeros)
    # a span's shard offset is the same on every rank
    for lo, hi, _, base in shard_map.spans:
        assert {at for rank in range(world)
                for _, _, at in owned_in(shard_map.pieces(rank), lo, hi)} == {base}
    assert shard_map.shard_numel == sum(-(-(hi - lo) // world) for lo, hi in spans)


def test_param_pieces_are_relative_to_the_parameter():
    pieces = [(0, 3, 0), (10, 14, 3)]
    assert param_pieces(pieces, 2, 10) == [(0, 1, 2), (8, 10, 3)]
    assert param_pieces(pieces, 4, 5) == []


def test_spans_must_cover_the_unit():
    with pytest.raises(ValueError, match="cover"):
        ShardMap(10, 2, [(0, 4), (5, 10)])
    with pytest.raises(ValueError, match="end at 8"):
        ShardMap(10, 2, [(0, 4), (4, 8)])
