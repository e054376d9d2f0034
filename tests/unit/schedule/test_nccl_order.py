"""The NCCL model's creation rule (odc_pp.schedule.nccl_order): the first operation a
rank issues on a communicator blocks until every member reached its own first operation
there.

* without the start-up warm-up (lazy creation, the code before it) the lowered schedules
  of 1f1b and zb-h1 at pp 2, 4 and 8, interleaved at pp 2 and 8, v-half and v-min at
  pp 4 and 8, gis at pp 2, 4 and 8, and zb-h2, zb-auto, zbv and offload at pp 8
  deadlock at their first
  messages; the report names the blocked ranks;
* with the warm-up every family passes at pp 2, 4 and 8, batched or not;
* the warm-up order itself cannot deadlock for whole topologies (tp x pp x dp, including
  tp=2 x pp=2), while rank-local orders can.
"""

from __future__ import annotations

import random

import pytest

from odc_pp.runtime.p2p_channels import (ChannelLayout, Communicator, channel_communicators,
                                         warmup_order)
from odc_pp.schedule.costs import CostModel
from odc_pp.schedule.nccl_order import check_creation_order
from odc_pp.schedule.validate import ScheduleError, check_nccl_order

# (family, pp) the creation rule finds stuck without the warm-up
LAZY_STUCK = {("1f1b", 2), ("1f1b", 4), ("1f1b", 8), ("interleaved", 2), ("interleaved", 8),
              ("zb-h1", 2), ("zb-h1", 4), ("zb-h1", 8), ("zb-h2", 8), ("zb-auto", 8),
              ("zbv", 8), ("v-half", 4), ("v-half", 8), ("v-min", 4), ("v-min", 8),
              ("offload", 8), ("gis", 2), ("gis", 4), ("gis", 8)}


def _lowered(name: str, pp: int):
    from odc_pp.schedule.build import PLANNED_CHUNKS, ScheduleRequest, build
    from odc_pp.schedule.generators.families import family

    fam = family(name)
    costs = CostModel(offload_bandwidth=1.0) if fam.offloads else None
    m = max(2 * pp if pp <= 4 else pp, fam.microbatches_per_rank * pp)
    return build(ScheduleRequest.of(name, pp=pp, num_microbatches=m, offload=PLANNED_CHUNKS,
                                    assumed_offload_bandwidth=None, post_validation=True),
                 costs)


def _cases():
    from odc_pp.schedule.generators.families import FAMILIES

    for fam in FAMILIES:
        for pp in (2, 4, 8):
            yield pytest.param(fam.name, pp, id=f"{fam.name}-pp{pp}")


@pytest.mark.parametrize("name,pp", list(_cases()))
def test_every_family_passes_after_the_warm_up_and_lazy_creation_hangs_the_known_ones(
        name, pp):
    schedule = _lowered(name, pp)
    for batch_sends in (True, False):
        check_nccl_order(schedule, ChannelLayout.DIRECTED, batch_sends=batch_sends)
        if (name, pp) in LAZY_STUCK:
            with pytest.raises(ScheduleError, match="blocks in the first operation on "
                                                    "communicator"):
                check_nccl_order(schedule, ChannelLayout.DIRECTED, batch_sends=batch_sends,
                                 warm_up=False)
        else:
            check_nccl_order(schedule, ChannelLayout.DIRECTED, batch_sends=batch_sends,
                             warm_up=False)


def test_lazy_creation_report_names_both_ranks_of_1f1b_pp2():
    with pytest.raises(ScheduleError) as error:
        check_nccl_order(_lowered("1f1b", 2), ChannelLayout.DIRECTED, warm_up=False)
    text = str(error.value)
    # rank 0 posts RECV_B0.0 (channel 1->0) before its SEND_F0.0; rank 1 its RECV_F0.0
    assert "rank 0 position" in text and "RECV_B0.0" in text, text
    assert "rank 1 position 0 (RECV_F0.0)" in text, text
    assert "('directed', 1, 0), whose creation waits for rank(s) [1]" in text, text
    assert "('directed', 0, 1), whose creation waits for rank(s) [0]" in text, text


def _topology(tp: int, pp: int, dp: int) -> list[Communicator]:
    from odc_pp.layout import topology_groups

    groups = topology_groups(pp=pp, tp=tp, dp=dp)
    comms = [Communicator(ranks=tuple(range(tp * pp * dp)), kind="world")]
    for kind, lists in groups.items():
        comms += [Communicator(ranks=tuple(sorted(r)), kind=kind) for r in lists if len(r) > 1]
    for pipeline in groups["pp"]:
        comms += channel_communicators(pipeline)
    return comms


def _sequences(comms, order):
    members = {c.order: c.ranks for c in comms}
    world = max(max(c.ranks) for c in comms) + 1
    return {rank: [c.order for c in order(rank, comms) if rank in c.ranks]
            for rank in range(world)}, members


@pytest.mark.parametrize("tp,pp,dp", [(1, 2, 1), (2, 2, 1), (2, 2, 2), (1, 4, 2), (1, 8, 1),
                                      (8, 4, 2)])
def test_the_warm_up_order_creates_every_topology_group_without_deadlock(tp, pp, dp):
    comms = _topology(tp, pp, dp)
    sequences, members = _sequences(comms, lambda rank, c: warmup_order(c))
    check_creation_order(sequences, members)
    # every rank touches every group it belongs to, channels included
    assert all(len(seq) == sum(r in c.ranks for c in comms) for r, seq in sequences.items())


def test_rank_local_orders_deadlock_under_the_creation_rule():
    comms = _topology(1, 2, 1)

    def outgoing_first(rank, comms):  # each rank its own send channel first: a cycle
        return sorted(comms, key=lambda c: (c.kind != "p2p", c.detail[:1] != (rank,)))

    sequences, members = _sequences(comms, outgoing_first)
    with pytest.raises(ScheduleError, match="rank 0 waits in the creation.*rank 1 waits"):
        check_creation_order(sequences, members)


def test_warmup_order_agrees_on_shared_communicators_for_random_groups():
    rng = random.Random(5)
    for _ in range(50):
        world = rng.randint(2, 9)
        comms = {Communicator(
            ranks=tuple(sorted(rng.sample(range(world), rng.randint(2, world)))),
            kind=rng.choice(["tp", "dp", "p2p"]), detail=(rng.randint(0, 3),))
            for _ in range(rng.randint(1, 12))}
        comms = list(comms)
        rng.shuffle(comms)  # each rank may list them in any order
        sequences, members = _sequences(comms, lambda rank, c: warmup_order(
            rng.sample(c, len(c))))
        check_creation_order(sequences, members)


def test_duplicate_warmup_keys_are_refused():
    with pytest.raises(ValueError, match="share the warm-up key"):
        warmup_order([Communicator(ranks=(0, 1), kind="dp"),
                      Communicator(ranks=(0, 1), kind="dp")])
