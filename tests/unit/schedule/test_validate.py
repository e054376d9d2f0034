"""validate(): each rule catches a hand-broken schedule and names the offending action."""

from __future__ import annotations

import pytest

from odc_pp.schedule import Action, ActionKind, CostModel, Schedule
from odc_pp.schedule.generators import generate
from odc_pp.schedule.lowering import lower, lower_communication
from odc_pp.schedule.validate import ScheduleError, memory_profile, peak_memory, validate

F, B, W, BW = ActionKind.F, ActionKind.B, ActionKind.W, ActionKind.BW


def one_f_one_b(pp=3, num_microbatches=4) -> Schedule:
    return generate("1f1b", pp=pp, num_microbatches=num_microbatches)


def replace(schedule: Schedule, rank: int, index: int, action: Action | None) -> Schedule:
    ranks = [list(r) for r in schedule.ranks]
    if action is None:
        del ranks[rank][index]
    else:
        ranks[rank][index] = action
    return schedule.copy(ranks=ranks)


def swap(schedule: Schedule, rank: int, first: int, second: int) -> Schedule:
    ranks = [list(r) for r in schedule.ranks]
    ranks[rank][first], ranks[rank][second] = ranks[rank][second], ranks[rank][first]
    return schedule.copy(ranks=ranks)


def test_error_is_a_value_error():
    assert issubclass(ScheduleError, ValueError)


def test_valid_schedules_pass():
    for name in ("1f1b", "zb-h1", "zbv", "dualpipev"):
        schedule = generate(name, pp=3, num_microbatches=6)
        validate(schedule)
        validate(lower(schedule))


def test_action_in_wrong_rank_list():
    schedule = one_f_one_b()
    bad = replace(schedule, 1, 0, Action(rank=2, kind=F, microbatch=0))
    with pytest.raises(ScheduleError, match="rank 1 position 0 .*says rank 2"):
        validate(bad)


def test_microbatch_and_chunk_out_of_range():
    schedule = one_f_one_b()
    with pytest.raises(ScheduleError, match="microbatch outside"):
        validate(replace(schedule, 0, 0, Action(rank=0, kind=F, microbatch=9)))
    with pytest.raises(ScheduleError, match="chunk outside"):
        validate(replace(schedule, 0, 0, Action(rank=0, kind=F, chunk=1, microbatch=0)))


def test_missing_and_duplicate_compute():
    schedule = one_f_one_b()
    with pytest.raises(ScheduleError, match="rank 2 chunk 0 microbatch 3: missing"):
        validate(replace(schedule, 2, len(schedule.ranks[2]) - 1, None))
    dup = schedule.copy()
    dup.ranks[0].append(Action(rank=0, kind=F, microbatch=0))
    with pytest.raises(ScheduleError, match=r"duplicate F"):
        validate(dup)


def test_fused_and_split_backward_mixed():
    schedule = one_f_one_b(pp=2, num_microbatches=2)
    mixed = schedule.copy()
    mixed.ranks[1].append(Action(rank=1, kind=W, microbatch=0))
    with pytest.raises(ScheduleError, match="fused BW together with a separate B or W"):
        validate(mixed)


def test_b_without_w():
    schedule = generate("zb-h1", pp=2, num_microbatches=2)
    index = next(i for i, a in enumerate(schedule.ranks[0]) if a.kind is W)
    with pytest.raises(ScheduleError, match="missing W after its B"):
        validate(replace(schedule, 0, index, None))


def test_local_order():
    schedule = generate("zb-h1", pp=2, num_microbatches=2)
    rank0 = schedule.ranks[0]
    b0 = rank0.index(Action(rank=0, kind=B, microbatch=0))
    w0 = rank0.index(Action(rank=0, kind=W, microbatch=0))
    with pytest.raises(ScheduleError, match=r"\(W0\.0\): comes before the B"):
        validate(swap(schedule, 0, b0, w0))
    # rank 1 (last stage): put its final backward first
    bad = schedule.copy(ranks=[list(r) for r in schedule.ranks])
    bad.ranks[1].insert(0, bad.ranks[1].pop(
        bad.ranks[1].index(Action(rank=1, kind=B, microbatch=1))))
    with pytest.raises(ScheduleError, match=r"rank 1 position 0 \(B0\.1\): comes before"):
        validate(bad)


def test_cross_rank_cycle_is_a_deadlock():
    # rank 0 waits for rank 1's backward before sending it the forward it needs
    schedule = Schedule(name="cycle", pp=2, num_microbatches=2)
    schedule.extend([Action(rank=0, kind=F, microbatch=0), Action(rank=0, kind=BW, microbatch=0),
                     Action(rank=0, kind=F, microbatch=1), Action(rank=0, kind=BW, microbatch=1)])
    schedule.extend([Action(rank=1, kind=F, microbatch=1), Action(rank=1, kind=BW, microbatch=1),
                     Action(rank=1, kind=F, microbatch=0), Action(rank=1, kind=BW, microbatch=0)])
    with pytest.raises(ScheduleError, match="deadlocks") as info:
        validate(schedule)
    assert "rank 0 position 1 (BW0.0)" in str(info.value)
    assert "rank 1 position 0 (F0.1)" in str(info.value)


def test_memory_limit():
    schedule = one_f_one_b(pp=4, num_microbatches=8)
    validate(schedule, memory_limit=4)
    with pytest.raises(ScheduleError, match=r"rank 0 position 3 \(F0\.3\): activation memory "
                                            r"4 exceeds the limit 3"):
        validate(schedule, memory_limit=3)
    assert peak_memory(schedule) == [4, 3, 2, 1]
    releasing = CostModel(mem_f=1, mem_b=-1, mem_w=0)
    assert memory_profile(schedule, releasing)[3][:2] == [1, 0]


def test_lowered_missing_recv():
    lowered = lower(one_f_one_b())
    index = next(i for i, a in enumerate(lowered.ranks[1]) if a.kind is ActionKind.RECV_F)
    with pytest.raises(ScheduleError, match="no matching RECV on rank 1"):
        validate(replace(lowered, 1, index, None))


def test_lowered_wrong_peer():
    lowered = lower(one_f_one_b())
    index = next(i for i, a in enumerate(lowered.ranks[1]) if a.kind is ActionKind.RECV_F)
    action = lowered.ranks[1][index]
    bad = replace(lowered, 1, index, Action(rank=1, kind=action.kind, chunk=action.chunk,
                                            microbatch=action.microbatch, peer=2))
    with pytest.raises(ScheduleError, match="peer should be rank 0"):
        validate(bad)


def test_lowered_recv_order_must_match_send_order():
    lowered = lower(one_f_one_b())
    recvs = [i for i, a in enumerate(lowered.ranks[1]) if a.kind is ActionKind.RECV_F]
    with pytest.raises(ScheduleError, match="not in the order of its SENDs"):
        validate(swap(lowered, 1, recvs[0], recvs[1]))


def test_lowered_recv_after_consumer():
    lowered = lower(one_f_one_b(pp=2, num_microbatches=1))
    rank1 = lowered.ranks[1]
    recv = next(i for i, a in enumerate(rank1) if a.kind is ActionKind.RECV_F)
    consumer = next(i for i, a in enumerate(rank1) if a.kind is F)
    with pytest.raises(ScheduleError, match=r"\(F0\.0\): its input from rank 0 has no RECV_F"):
        validate(swap(lowered, 1, recv, consumer))


def test_send_between_stages_of_one_rank_is_rejected():
    schedule = generate("zbv", pp=2, num_microbatches=3)
    lowered = lower_communication(schedule)
    # rank 1 holds stages 1 and 2 (the turn of the V): no transfer is allowed there
    bad = lowered.copy()
    index = bad.ranks[1].index(Action(rank=1, kind=F, chunk=0, microbatch=0))
    bad.ranks[1].insert(index + 1, Action(rank=1, kind=ActionKind.SEND_F, chunk=0,
                                          microbatch=0, peer=0))
    with pytest.raises(ScheduleError, match="both stages are on rank 1"):
        validate(bad)


def test_send_placed_after_a_wait_that_needs_it_deadlocks():
    lowered = lower(one_f_one_b(pp=2, num_microbatches=1))
    rank0 = list(lowered.ranks[0])
    send = next(i for i, a in enumerate(rank0) if a.kind is ActionKind.SEND_F)
    moved = rank0.pop(send)
    rank0.append(moved)  # rank 0 now waits for the gradient before sending the activation
    with pytest.raises(ScheduleError, match="deadlocks"):
        validate(lowered.copy(ranks=[rank0, lowered.ranks[1]]))


def test_post_validation_rules():
    schedule = one_f_one_b(pp=2, num_microbatches=2)
    marker = Action(rank=0, kind=ActionKind.POST_VALIDATION, chunk=-1, microbatch=-1)
    early = schedule.copy()
    early.ranks[0].insert(0, marker)
    with pytest.raises(ScheduleError, match="gradient work after POST_VALIDATION"):
        validate(early)
    twice = schedule.copy()
    twice.ranks[0] += [marker, marker]
    with pytest.raises(ScheduleError, match="second POST_VALIDATION"):
        validate(twice)
    bad_fields = schedule.copy()
    bad_fields.ranks[0].append(Action(rank=0, kind=ActionKind.POST_VALIDATION))
    with pytest.raises(ScheduleError, match="chunk=microbatch=-1"):
        validate(bad_fields)


def test_offload_rules():
    schedule = one_f_one_b(pp=2, num_microbatches=1)
    offload = Action(rank=0, kind=ActionKind.OFFLOAD, microbatch=0)
    reload = Action(rank=0, kind=ActionKind.RELOAD, microbatch=0)
    rank0 = schedule.ranks[0]  # F0.0, BW0.0
    with pytest.raises(ScheduleError, match="offloaded and not reloaded"):
        validate(schedule.copy(ranks=[[rank0[0], offload, rank0[1]], schedule.ranks[1]]))
    with pytest.raises(ScheduleError, match="before the OFFLOAD"):
        validate(schedule.copy(ranks=[[rank0[0], reload, offload, rank0[1]],
                                      schedule.ranks[1]]))
    good = schedule.copy(ranks=[[rank0[0], offload, reload, rank0[1]], schedule.ranks[1]])
    validate(good)
    assert memory_profile(good)[0] == [1, 0, 1, 0]


# ----- NCCL order (issue 10 item 8) ------------------------------------------------------
def test_nccl_mode_rejects_recv_before_opposite_send_on_a_shared_channel():
    """Today's 1F1B pp=2 lowering, built by hand: rank 0 issues send F0, recv B0, send F1;
    rank 1 recv F0, recv F1, send B0. One FIFO per unordered pair deadlocks after F0."""
    from odc_pp.schedule.channels import ChannelLayout

    SF, RF, SB, RB = (ActionKind.SEND_F, ActionKind.RECV_F, ActionKind.SEND_B,
                      ActionKind.RECV_B)
    a = Action
    rank0 = [a(rank=0, kind=F, microbatch=0), a(rank=0, kind=SF, microbatch=0, peer=1),
             a(rank=0, kind=RB, microbatch=0, peer=1),
             a(rank=0, kind=F, microbatch=1), a(rank=0, kind=SF, microbatch=1, peer=1),
             a(rank=0, kind=BW, microbatch=0),
             a(rank=0, kind=RB, microbatch=1, peer=1), a(rank=0, kind=BW, microbatch=1)]
    rank1 = [a(rank=1, kind=RF, microbatch=0, peer=0), a(rank=1, kind=RF, microbatch=1, peer=0),
             a(rank=1, kind=F, microbatch=0), a(rank=1, kind=BW, microbatch=0),
             a(rank=1, kind=SB, microbatch=0, peer=0),
             a(rank=1, kind=F, microbatch=1), a(rank=1, kind=BW, microbatch=1),
             a(rank=1, kind=SB, microbatch=1, peer=0)]
    schedule = Schedule(name="1f1b-today", pp=2, num_microbatches=2, ranks=[rank0, rank1])
    validate(schedule)  # fine under tag matching (gloo)
    with pytest.raises(ScheduleError, match=r"deadlock under NCCL.*rank 0 position 5 "
                                            r"\(B0\.0|deadlock under NCCL.*rank 1 position"):
        validate(schedule, nccl_layout=ChannelLayout.SHARED)
    # the same order on one channel per direction runs
    validate(schedule, nccl_layout=ChannelLayout.DIRECTED)


def test_nccl_mode_names_stuck_ranks_and_actions():
    from odc_pp.schedule.channels import ChannelLayout
    from odc_pp.schedule.validate import check_nccl_order

    lowered = lower(generate("1f1b", pp=2, num_microbatches=3))
    with pytest.raises(ScheduleError) as error:
        check_nccl_order(lowered, ChannelLayout.SHARED, batch_sends=False)
    text = str(error.value)
    assert "rank 0 position" in text and "rank 1 position" in text and "RECV" in text


def _nccl_cases():
    from odc_pp.schedule.generators.families import FAMILIES

    for fam in FAMILIES:
        for pp in (2, 4, 8, 16):
            yield pytest.param(fam.name, pp, id=f"{fam.name}-pp{pp}")


@pytest.mark.parametrize("name,pp", list(_nccl_cases()))
def test_nccl_mode_accepts_every_lowered_family_on_directed_channels(name, pp):
    from odc_pp.schedule.channels import ChannelLayout
    from odc_pp.schedule.build import PLANNED_CHUNKS, ScheduleRequest, build
    from odc_pp.schedule.generators.families import family

    fam = family(name)
    costs = CostModel(offload_bandwidth=1.0) if fam.offloads else None
    m = max(2 * pp if pp <= 4 else pp, fam.microbatches_per_rank * pp)
    schedule = build(ScheduleRequest.of(name, pp=pp, num_microbatches=m,
                                        offload=PLANNED_CHUNKS, assumed_offload_bandwidth=None,
                                        post_validation=True), costs)
    from odc_pp.schedule.validate import check_nccl_order

    for batch_sends in (True, False):
        check_nccl_order(schedule, ChannelLayout.DIRECTED, batch_sends=batch_sends)
    validate(schedule, nccl_layout=ChannelLayout.DIRECTED)
