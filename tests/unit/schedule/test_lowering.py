"""Lowering passes, each on its own, plus the chained ``lower``.

Communication is checked three ways: ``validate``, SIM's simulator (a lowered schedule
must time exactly like its compute-only original when SENDs follow producers and RECVs
never delay anyone), and an independent executor below that matches point-to-point
messages in order per rank pair, as NCCL does, and blocks only at consumers.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from odc_pp.schedule import Action, ActionKind, CostModel, Schedule
from odc_pp.schedule.generators import generate
from odc_pp.schedule.lowering import (insert_offload, insert_post_validation, lower,
                                      lower_communication)
from odc_pp.schedule.simulator import simulate
from odc_pp.schedule.validate import validate

SEND = (ActionKind.SEND_F, ActionKind.SEND_B)
RECV = (ActionKind.RECV_F, ActionKind.RECV_B)
BACKWARD = (ActionKind.B, ActionKind.BW)


def _message(schedule: Schedule, action: Action) -> tuple:
    """(direction, producer stage, microbatch) of a SEND or RECV."""
    stage = schedule.stage_of(action.rank, action.chunk)
    if action.kind is ActionKind.SEND_F:
        return "F", stage, action.microbatch
    if action.kind is ActionKind.SEND_B:
        return "B", stage, action.microbatch
    if action.kind is ActionKind.RECV_F:
        return "F", stage - 1, action.microbatch
    return "B", stage + 1, action.microbatch


def run_in_order_matching(schedule: Schedule) -> None:
    """Execute a lowered schedule: SEND/RECV never block; the k-th RECV on dst from src
    takes the k-th SEND from src to dst (and must be the tensor it expects); a compute
    waits for its RECV'd message (cross-rank) or its producer (same rank)."""
    pointer = [0] * schedule.pp
    sent: dict[tuple[int, int], list[tuple]] = defaultdict(list)
    posted: dict[tuple[int, int], int] = defaultdict(int)
    recv_slot: dict[tuple[int, tuple], tuple[tuple[int, int], int]] = {}
    done: set[tuple] = set()
    progress = True
    while progress:
        progress = False
        for rank, actions in enumerate(schedule.ranks):
            while pointer[rank] < len(actions):
                action = actions[pointer[rank]]
                if action.kind in SEND:
                    sent[(rank, action.peer)].append(_message(schedule, action))
                elif action.kind in RECV:
                    pair = (action.peer, rank)
                    recv_slot[(rank, _message(schedule, action))] = (pair, posted[pair])
                    posted[pair] += 1
                elif action.kind is ActionKind.F or action.kind in BACKWARD:
                    if not _inputs_ready(schedule, action, sent, recv_slot, done):
                        break
                if action.is_compute:
                    tag = "F" if action.kind is ActionKind.F else (
                        "B" if action.kind in BACKWARD else "W")
                    done.add((tag, schedule.stage_of(rank, action.chunk), action.microbatch))
                pointer[rank] += 1
                progress = True
    stuck = [(r, schedule.ranks[r][p].short()) for r, p in enumerate(pointer)
             if p < len(schedule.ranks[r])]
    assert not stuck, f"deadlock under in-order matching: {stuck}"
    for pair, count in posted.items():
        assert count == len(sent[pair]), f"pair {pair}: {count} RECVs, {len(sent[pair])} SENDs"


def _inputs_ready(schedule, action, sent, recv_slot, done) -> bool:
    stage = schedule.stage_of(action.rank, action.chunk)
    if action.kind is ActionKind.F:
        if stage == 0:
            return True
        producer, tag = stage - 1, "F"
    else:
        if stage == schedule.num_stages - 1:
            return True
        producer, tag = stage + 1, "B"
    if schedule.locate(producer)[0] == action.rank:
        return (tag, producer, action.microbatch) in done
    key = (action.rank, (tag, producer, action.microbatch))
    assert key in recv_slot, f"{action.short()} on rank {action.rank}: no RECV posted before it"
    pair, index = recv_slot[key]
    if len(sent[pair]) <= index:
        return False
    assert sent[pair][index] == key[1], (
        f"{action.short()} on rank {action.rank} would receive {sent[pair][index]} "
        f"instead of {key[1]}: RECV order differs from SEND order")
    return True


def check_contract(original: Schedule, lowered: Schedule) -> None:
    for rank, actions in enumerate(lowered.ranks):
        assert [a for a in actions if a.is_compute] == original.compute_actions(rank)
        for index, action in enumerate(actions):
            if action.kind in SEND:  # right after its producer (no other action between)
                producer = actions[index - 1]
                assert producer.is_compute and producer.chunk == action.chunk \
                    and producer.microbatch == action.microbatch
                assert (producer.kind is ActionKind.F) == (action.kind is ActionKind.SEND_F)
            if action.is_compute:
                crossing = lowered.next_stage_rank(rank, action.chunk) if \
                    action.kind is ActionKind.F else lowered.prev_stage_rank(rank, action.chunk)
                sends = action.kind in (ActionKind.F, *BACKWARD) and crossing not in (None, rank)
                follows = index + 1 < len(actions) and actions[index + 1].kind in SEND
                assert sends == follows, f"{action.short()} on rank {rank}"
    validate(lowered)
    run_in_order_matching(lowered)


CASES = [("1f1b", 4, 6), ("interleaved", 2, 5), ("interleaved", 3, 7), ("zb-h1", 3, 5),
         ("zb-h2", 4, 8), ("zbv", 3, 6), ("v-half", 4, 8), ("v-min", 3, 7),
         ("dualpipev", 3, 7), ("offload", 4, 8)]


@pytest.mark.parametrize("name,pp,num_microbatches", CASES)
@pytest.mark.parametrize("lookahead", [0, 1, 3])
def test_lower_communication_contract(name, pp, num_microbatches, lookahead):
    costs = CostModel(offload_bandwidth=1.0)
    schedule = generate(name, pp=pp, num_microbatches=num_microbatches, costs=costs)
    lowered = lower_communication(schedule, recv_lookahead=lookahead)
    check_contract(schedule, lowered)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(["1f1b", "interleaved", "zb-h1", "zb-h2", "zbv", "v-half",
                             "v-min", "dualpipev"]),
       pp=st.integers(2, 8), num_microbatches=st.integers(1, 24),
       chunks=st.integers(2, 4), t_comm=st.floats(0.0, 2.0),
       t_f=st.floats(0.2, 3.0), t_b=st.floats(0.2, 3.0), t_w=st.floats(0.2, 3.0))
def test_lowering_keeps_timing_and_matches_in_order(name, pp, num_microbatches, chunks,
                                                    t_comm, t_f, t_b, t_w):
    """Explicit SEND/RECV time exactly like implicit transfers: nothing is serialised."""
    costs = CostModel(t_f=t_f, t_b=t_b, t_w=t_w, t_comm=t_comm)
    kwargs = {"num_chunks": chunks} if name == "interleaved" else {}
    try:
        schedule = generate(name, pp=pp, num_microbatches=num_microbatches, costs=costs,
                            **kwargs)
    except ValueError as error:
        assert "num_microbatches >=" in str(error)
        return
    lowered = lower_communication(schedule)
    check_contract(schedule, lowered)
    implicit, explicit = simulate(schedule, costs), simulate(lowered, costs)
    assert explicit.makespan == pytest.approx(implicit.makespan)
    for action, start in implicit.start.items():
        assert explicit.start[action] == pytest.approx(start)


def test_no_transfer_at_the_turn_of_a_v():
    schedule = generate("zbv", pp=4, num_microbatches=8)
    lowered = lower_communication(schedule)
    last = lowered.ranks[3]  # holds stages 3 and 4
    assert not [a for a in last if a.kind is ActionKind.SEND_F and a.chunk == 0]
    assert not [a for a in last if a.kind is ActionKind.RECV_F and a.chunk == 1]
    assert not [a for a in last if a.kind is ActionKind.SEND_B and a.chunk == 1]
    first = lowered.ranks[0]  # stage 0 and the last stage: only inner transfers
    assert not [a for a in first if a.kind in (ActionKind.RECV_F, ActionKind.SEND_B)
                and a.chunk == 0]
    peers = {a.peer for a in first if a.peer is not None}
    assert peers == {1}


def test_recv_lookahead_positions():
    schedule = generate("1f1b", pp=2, num_microbatches=3)
    rank1 = lower_communication(schedule, recv_lookahead=0).ranks[1]
    for index, action in enumerate(rank1):
        if action.kind is ActionKind.RECV_F:
            consumer = rank1[index + 1]
            assert consumer.kind is ActionKind.F and consumer.microbatch == action.microbatch
    rank1 = lower_communication(schedule, recv_lookahead=1).ranks[1]
    recv = rank1.index(Action(rank=1, kind=ActionKind.RECV_F, microbatch=1, peer=0))
    consumer = rank1.index(Action(rank=1, kind=ActionKind.F, microbatch=1))
    computes_between = [a for a in rank1[recv:consumer] if a.is_compute]
    assert len(computes_between) == 1  # posted one compute ahead


def test_lower_communication_rejects_lowered_input():
    lowered = lower_communication(generate("1f1b", pp=2, num_microbatches=2))
    with pytest.raises(ValueError, match="already has communication"):
        lower_communication(lowered)
    with pytest.raises(ValueError, match="recv_lookahead"):
        lower_communication(generate("1f1b", pp=2, num_microbatches=2), recv_lookahead=-1)


# ----- offload ------------------------------------------------------------------------
def test_insert_offload_places_and_hides_transfers():
    costs = CostModel(offload_bandwidth=4.0)
    schedule = generate("interleaved", pp=4, num_microbatches=8)
    offloaded = insert_offload(schedule, costs, [0])
    validate(offloaded)
    assert offloaded.meta["offload_chunks"] == [0]
    for rank, actions in enumerate(offloaded.ranks):
        kinds = [a.kind for a in actions]
        assert kinds.count(ActionKind.OFFLOAD) == kinds.count(ActionKind.RELOAD) == 8
        for index, action in enumerate(actions):
            if action.kind is ActionKind.OFFLOAD:
                producer = actions[index - 1]
                assert (producer.kind, producer.chunk, producer.microbatch) == (
                    ActionKind.F, 0, action.microbatch)
            if action.kind is ActionKind.RELOAD:
                backward = actions.index(Action(rank=rank, kind=ActionKind.BW,
                                                microbatch=action.microbatch))
                assert index < backward
    plain, moved = simulate(schedule, costs), simulate(offloaded, costs)
    assert moved.makespan == pytest.approx(plain.makespan)  # transfers hidden
    assert max(moved.peak_activation) < max(plain.peak_activation)
    for action, start in plain.start.items():  # no compute waits for a transfer
        assert moved.start[action] == pytest.approx(start)


def test_insert_offload_short_lifespan_reloads_right_away():
    costs = CostModel(offload_bandwidth=0.1)  # a transfer takes 10 compute units
    schedule = generate("1f1b", pp=2, num_microbatches=2)
    offloaded = insert_offload(schedule, costs, [0])
    validate(offloaded)
    for actions in offloaded.ranks:
        for index, action in enumerate(actions):
            if action.kind is ActionKind.RELOAD:
                assert actions[index - 1].kind is ActionKind.OFFLOAD
                assert actions[index - 1].microbatch == action.microbatch


def test_insert_offload_errors_and_meta_default():
    schedule = generate("offload", pp=2, num_microbatches=4,
                        costs=CostModel(offload_bandwidth=1.0))
    with pytest.raises(ValueError, match="outside 0..1"):
        insert_offload(schedule, CostModel(offload_bandwidth=1.0), [2])
    with pytest.raises(ValueError, match="offload_bandwidth"):
        insert_offload(schedule, CostModel(), [0])
    by_meta = insert_offload(schedule, CostModel(offload_bandwidth=1.0))
    count = sum(a.kind is ActionKind.OFFLOAD for a in by_meta.actions())
    assert count == 2 * 4 * len(schedule.meta["offload_chunks"])
    with pytest.raises(ValueError, match="already has OFFLOAD"):
        insert_offload(by_meta, CostModel(offload_bandwidth=1.0), [0])


# ----- post-validation ------------------------------------------------------------------
@pytest.mark.parametrize("name", ["1f1b", "zb-h1", "zbv", "dualpipev"])
def test_insert_post_validation(name):
    schedule = lower_communication(generate(name, pp=3, num_microbatches=6))
    marked = insert_post_validation(schedule)
    validate(marked)
    for rank, actions in enumerate(marked.ranks):
        markers = [i for i, a in enumerate(actions) if a.kind is ActionKind.POST_VALIDATION]
        assert len(markers) == 1
        at = markers[0]
        assert actions[at].chunk == actions[at].microbatch == -1
        grads = [i for i, a in enumerate(actions)
                 if a.kind in (ActionKind.B, ActionKind.BW, ActionKind.W)]
        assert max(grads) < at
        assert all(a.kind in SEND for a in actions[max(grads) + 1:at])
    with pytest.raises(ValueError, match="already has POST_VALIDATION"):
        insert_post_validation(marked)
    simulate(marked, CostModel())


# ----- chained ----------------------------------------------------------------------------
def test_lower_chains_all_passes():
    costs = CostModel(offload_bandwidth=2.0, t_comm=0.1)
    schedule = generate("offload", pp=4, num_microbatches=8, costs=costs)
    full = lower(schedule, costs, post_validation=True)
    validate(full, costs)
    kinds = {a.kind for a in full.actions()}
    assert {ActionKind.SEND_F, ActionKind.RECV_B, ActionKind.OFFLOAD, ActionKind.RELOAD,
            ActionKind.POST_VALIDATION} <= kinds
    run_in_order_matching(full)
    assert simulate(full, costs).makespan > 0
    none = lower(schedule, costs, offload=False, communication=False)
    assert [a for a in none.actions()] == [a for a in schedule.actions()]
    with pytest.raises(ValueError, match="ambiguous"):
        lower(schedule, costs, offload=True)
    assert schedule.meta["offload_chunks"] and "OFFLOAD" not in {
        a.kind.value for a in schedule.actions()}  # passes never mutate their input
