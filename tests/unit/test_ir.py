import pytest

from odc_pp.schedule import Action, ActionKind, Placement, Schedule


@pytest.mark.parametrize("placement", list(Placement))
@pytest.mark.parametrize("pp,chunks", [(1, 1), (2, 2), (4, 2), (3, 3), (4, 4)])
def test_placement_is_a_bijection(placement, pp, chunks):
    schedule = Schedule(name="x", pp=pp, num_microbatches=1, num_chunks=chunks,
                        placement=placement)
    seen = set()
    for stage in range(schedule.num_stages):
        rank, chunk = schedule.locate(stage)
        assert schedule.stage_of(rank, chunk) == stage
        seen.add((rank, chunk))
    assert len(seen) == pp * chunks


def test_v_placement_puts_first_and_last_stage_on_rank_zero():
    schedule = Schedule(name="v", pp=4, num_microbatches=1, num_chunks=2, placement="v")
    assert schedule.locate(0) == (0, 0)
    assert schedule.locate(7) == (0, 1)
    assert schedule.locate(3) == (3, 0) and schedule.locate(4) == (3, 1)


def test_json_round_trip_is_lossless():
    schedule = Schedule(name="t", pp=2, num_microbatches=2, num_chunks=1, meta={"k": 1})
    schedule.extend([
        Action(rank=0, kind=ActionKind.F, chunk=0, microbatch=0),
        Action(rank=0, kind=ActionKind.SEND_F, chunk=0, microbatch=0, peer=1),
        Action(rank=1, kind=ActionKind.RECV_F, chunk=0, microbatch=0, peer=0),
        Action(rank=1, kind=ActionKind.BW, chunk=0, microbatch=0),
        Action(rank=1, kind=ActionKind.POST_VALIDATION, chunk=-1, microbatch=-1),
    ])
    again = Schedule.from_json(schedule.to_json())
    assert again == schedule


def test_bad_cost_model_is_a_value_error():
    from odc_pp.schedule import CostModel
    with pytest.raises(ValueError, match="t_f"):
        CostModel(t_f=-1)
    with pytest.raises(ValueError, match="sum to zero"):
        CostModel(mem_f=1, mem_b=0, mem_w=0)
