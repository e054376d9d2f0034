"""Sequence packing, data side: packed rows (positions restart per sample, segment ids,
no label across a sample boundary), the packed token cap, and LB-Mini's cost-balanced
packing."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from odc_pp.data import (AttentionCost, Sample, TokenCost, collate, pack, pack_microbatches,
                         plan_minibatch, split_by_tokens)


def sample(ids, mask=None):
    ids = np.asarray(ids, dtype=np.int64)
    mask = np.ones(len(ids) - 1, np.float32) if mask is None else np.asarray(mask, np.float32)
    return Sample(tokens=ids, loss_mask=mask)


def test_pack_fields():
    a = sample([1, 2, 3, 4], [0, 1, 1])
    b = sample([7, 8])
    c = sample([9, 10, 11], [1, 0])
    mb = pack([a, b, c])
    assert mb.tokens.tolist() == [[1, 2, 3, 7, 9, 10]]
    assert mb.labels.tolist() == [[2, 3, 4, 8, 10, 11]]  # a's 4 is only a label, never 7
    assert mb.loss_mask.tolist() == [[0, 1, 1, 1, 1, 0]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 0, 0, 1]]
    assert mb.segment_ids.tolist() == [[0, 0, 0, 1, 2, 2]]
    assert mb.tokens.dtype == mb.labels.dtype == mb.position_ids.dtype == \
        mb.segment_ids.dtype == torch.int64
    assert mb.loss_mask.dtype == torch.float32
    assert mb.num_tokens == 4
    with pytest.raises(ValueError, match="empty"):
        pack([])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 50), min_size=2, max_size=12), min_size=1, max_size=6),
       st.randoms(use_true_random=False))
def test_every_packed_position_is_its_padded_position(rows, rnd):
    samples = [sample(ids, [rnd.choice([0, 1]) for _ in ids[1:]]) for ids in rows]
    packed, padded = pack(samples), collate(samples, pad_id=0)
    assert packed.num_tokens == padded.num_tokens  # packing keeps every loss token
    assert packed.tokens.shape == (1, sum(s.length for s in samples))
    for k, s in enumerate(samples):
        where = packed.segment_ids[0] == k
        assert packed.position_ids[0, where].tolist() == list(range(s.length))
        for field in ("tokens", "labels", "loss_mask"):
            assert getattr(packed, field)[0, where].tolist() == \
                getattr(padded, field)[k, :s.length].tolist()


def test_split_by_tokens_packed_caps_the_sum():
    lengths = [10, 10, 30, 5, 40]
    assert split_by_tokens(range(5), lengths, 40) == [[0, 1], [2], [3], [4]]  # padded
    assert split_by_tokens(range(5), lengths, 40, packed=True) == [[0, 1], [2, 3], [4]]
    assert split_by_tokens(range(3), [50, 1, 1], 40, packed=True) == [[0], [1, 2]]


def test_cost_packing_balances_rows_under_the_cap():
    lengths = np.array([60, 50, 40, 30, 20, 20, 10, 10, 5, 5])
    cost = AttentionCost(quadratic_coef=1 / 64)
    first_fit = pack_microbatches(range(10), lengths, 100)
    balanced = pack_microbatches(range(10), lengths, 100, cost)
    assert sorted(sum(balanced, [])) == list(range(10))
    assert len(balanced) == len(first_fit)
    assert all(lengths[b].sum() <= 100 for b in balanced)
    costs = cost(lengths)
    spread = lambda bins: max(costs[b].sum() for b in bins) - min(costs[b].sum() for b in bins)
    assert spread(balanced) < spread(first_fit)
    assert [costs[b].sum() for b in balanced] == sorted((costs[b].sum() for b in balanced),
                                                        reverse=True)
    # without a cost model: first-fit decreasing exactly as before
    assert pack_microbatches(range(10), lengths, 100, None) == first_fit


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 64), min_size=1, max_size=24), st.integers(64, 160))
def test_cost_packing_is_a_capped_partition(lengths, cap):
    lengths = np.array(lengths)
    bins = pack_microbatches(range(len(lengths)), lengths, cap, TokenCost())
    assert sorted(sum(bins, [])) == list(range(len(lengths)))
    assert all(0 < lengths[b].sum() <= cap for b in bins)
    assert len(bins) >= len(pack_microbatches(range(len(lengths)), lengths, cap))


@pytest.mark.parametrize("mode", ["none", "lb-mini", "balanced"])
def test_packed_plans_keep_every_sample_and_the_cap(mode):
    rng = np.random.default_rng(0)
    lengths = rng.integers(4, 64, size=32)
    plan = plan_minibatch(lengths, 2, max_tokens=128, mode=mode, packed=True,
                          cost_model=AttentionCost(quadratic_coef=1 / 384), min_microbatches=2)
    assert sorted(i for r in plan.microbatches for mb in r for i in mb) == list(range(32))
    assert all(lengths[mb].sum() <= 128 for r in plan.microbatches for mb in r)
    assert all(len(r) >= 2 for r in plan.microbatches)
    if mode == "none":  # packed in order: fewer microbatches than padded rows need
        padded = plan_minibatch(lengths, 2, max_tokens=128, mode=mode)
        assert plan.max_microbatches < padded.max_microbatches
