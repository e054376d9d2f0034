"""ScheduleRequest and build: the one way a schedule name becomes a (lowered) schedule."""

from __future__ import annotations

import dataclasses

import pytest

from odc_pp.schedule.build import PLANNED_CHUNKS, ScheduleRequest, build
from odc_pp.schedule.costs import CostModel
from odc_pp.schedule.generators import family, generate
from odc_pp.schedule.ir import ActionKind
from odc_pp.schedule.lowering import forward_only, lower, lower_communication


def test_request_resolves_the_family_once_and_is_a_frozen_cache_key():
    request = ScheduleRequest.of("zbv", pp=2, num_microbatches=4)
    assert request.family is family("zbv") and request.num_chunks == 2
    assert hash(request) == hash(ScheduleRequest.of("zbv", pp=2, num_microbatches=4))
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.pp = 3
    assert request.with_microbatches(6).num_microbatches == 6
    with pytest.raises(ValueError, match="nope"):
        ScheduleRequest.of("nope", pp=2, num_microbatches=4)


def test_offload_chunks_need_an_offloading_family():
    with pytest.raises(ValueError, match=r"offload_chunks \[0\] need an offloading"):
        ScheduleRequest.of("1f1b", pp=2, num_microbatches=4, offload_chunks=[0])
    with pytest.raises(ValueError, match="offload must be"):
        ScheduleRequest.of("1f1b", pp=2, num_microbatches=4, offload="some")


def test_search_options_reach_only_a_searched_family():
    plain = ScheduleRequest.of("1f1b", pp=2, num_microbatches=4, search={"objective": "span"})
    searched = ScheduleRequest.of("zb-auto", pp=2, num_microbatches=4,
                                  search={"objective": "span", "max_evaluations": None})
    assert plain.options == () and searched.options == (("objective", "span"),)


@pytest.mark.parametrize("name", ["1f1b", "zb-h1", "zbv", "interleaved"])
def test_build_ends_in_lower(name):
    costs = CostModel()
    request = ScheduleRequest.of(name, pp=2, num_microbatches=4, post_validation=True)
    expected = lower(generate(name, pp=2, num_microbatches=4, costs=costs), costs,
                     offload=False, post_validation=True)
    built = build(request, costs)
    assert built.ranks == expected.ranks
    kinds = {a.kind for a in built.actions()}
    assert {ActionKind.SEND_F, ActionKind.RECV_B, ActionKind.POST_VALIDATION} <= kinds
    compute = build(dataclasses.replace(request, communication=False, post_validation=False))
    assert not kinds & {ActionKind.OFFLOAD} and compute.ranks == generate(
        name, pp=2, num_microbatches=4).ranks


def test_forward_only_variant_is_the_lowered_forwards():
    request = ScheduleRequest.of("zbv", pp=2, num_microbatches=4, post_validation=True)
    expected = lower_communication(forward_only(generate("zbv", pp=2, num_microbatches=4)))
    assert build(request.evaluation()).ranks == expected.ranks


def test_offloading_family_offloads_every_chunk_or_the_planned_ones():
    every = build(ScheduleRequest.of("offload", pp=2, num_microbatches=4))
    chunks = {a.chunk for a in every.actions() if a.kind is ActionKind.OFFLOAD}
    assert chunks == set(range(every.num_chunks))
    one = build(ScheduleRequest.of("offload", pp=2, num_microbatches=4, offload_chunks=[0]))
    assert {a.chunk for a in one.actions() if a.kind is ActionKind.OFFLOAD} == {0}
    costs = CostModel(offload_bandwidth=1.0)
    planned = build(ScheduleRequest.of("offload", pp=2, num_microbatches=4,
                                       offload=PLANNED_CHUNKS), costs)
    plan = generate("offload", pp=2, num_microbatches=4, costs=costs)
    assert planned.ranks == lower(plan, costs).ranks
    # no bandwidth assumed: the family rejects costs without one
    with pytest.raises(ValueError, match="offload_bandwidth"):
        build(ScheduleRequest.of("offload", pp=2, num_microbatches=4,
                                 assumed_offload_bandwidth=None))
