"""Variable CP's slots (odc_pp.data.lanes): every sample lands in exactly one slot, rows
holding a document over a lane's budget are split over the lanes, the other samples fill
rows of at most the budget, N per slot, and the plan depends on the lengths alone."""

import pytest

from odc_pp.data.lanes import Slot, lane_slots


def test_long_rows_split_short_samples_fill_lane_rows():
    lengths = {0: 100, 1: 20, 2: 30, 3: 60, 4: 10, 5: 64, 6: 5}
    rows = [[0, 1], [2, 3], [4, 5, 6]]  # rows of up to 128 tokens, 2 lanes of 64
    slots = lane_slots(rows, lengths.__getitem__, lanes=2, lane_tokens=64)
    assert slots[0] == Slot(groups=((0, 1),), split=True)  # 100 > 64
    lanes = [s for s in slots if not s.split]
    assert all(len(s.groups) == 2 for s in lanes)
    placed = [i for s in lanes for g in s.groups for i in g]
    assert sorted(placed) == [2, 3, 4, 5, 6]
    assert all(sum(lengths[i] for i in g) <= 64 for s in lanes for g in s.groups)
    assert lane_slots(rows, lengths.__getitem__, lanes=2, lane_tokens=64) == slots


def test_the_last_bundle_is_padded_with_empty_rows():
    slots = lane_slots([[0], [1], [2]], lambda i: 40, lanes=2, lane_tokens=64)
    assert [s.groups for s in slots] == [((0,), (1,)), ((2,), ())]


@pytest.mark.parametrize("lanes,tokens", [(1, 64), (2, 0)])
def test_refuses_what_is_not_a_lane_plan(lanes, tokens):
    with pytest.raises(ValueError):
        lane_slots([[0]], lambda i: 1, lanes=lanes, lane_tokens=tokens)


def test_the_digest_names_the_plan():
    from odc_pp.data.lanes import slots_digest

    one = lane_slots([[0], [1], [2]], lambda i: 40, lanes=2, lane_tokens=64)
    other = lane_slots([[0], [1], [3]], lambda i: 40, lanes=2, lane_tokens=64)
    assert slots_digest(one) == slots_digest(list(one)) != slots_digest(other)
