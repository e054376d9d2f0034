"""The context-parallel layout arithmetic (odc_pp.megatron.context_parallel): which
tokens each rank holds, the inverse, RoPE positions, the per-rank document view and the
ring's block plan (the causal balance), on one process."""

import pytest
import torch

from odc_pp.megatron.context_parallel import (cp_block_plan, cp_local_cu_seqlens,
                                              cp_position_ids, cp_split, cp_token_indices,
                                              cp_unsplit, pair_mask, ring_comm_plan,
                                              segment_ids_from_lengths)
from odc_pp.megatron.packed_attention import packed_causal_mask
from odc_pp.schedule.checks import ScheduleError
from odc_pp.schedule.nccl_order import check_ring_order


def test_rank_i_holds_chunks_i_and_2n_minus_1_minus_i():
    assert cp_token_indices(16, 0, 2).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert cp_token_indices(16, 1, 2).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    assert cp_token_indices(8, 2, 4).tolist() == [2, 5]
    assert cp_token_indices(6, 0, 1).tolist() == list(range(6))


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_split_and_unsplit_are_inverse(size):
    seq = 8 * size
    held = torch.cat([cp_token_indices(seq, r, size) for r in range(size)])
    assert sorted(held.tolist()) == list(range(seq))
    hidden = torch.randn(seq, 2, 3)  # megatron's [s, b, h]
    parts = [cp_split(hidden, r, size) for r in range(size)]
    assert all(p.shape == (seq // size, 2, 3) for p in parts)
    assert torch.equal(cp_unsplit(parts), hidden)
    tokens = torch.arange(2 * seq).view(2, seq)  # [b, s]
    assert torch.equal(cp_unsplit([cp_split(tokens, r, size, dim=1) for r in range(size)],
                                  dim=1), tokens)


def test_bad_layouts_are_one_error_naming_the_flag():
    with pytest.raises(ValueError, match="--context-parallel-size 4 needs a sequence length "
                                         "divisible by 8"):
        cp_token_indices(20, 0, 4)
    with pytest.raises(ValueError, match="rank 2 of size 2"):
        cp_token_indices(16, 2, 2)
    with pytest.raises(ValueError, match="two equal chunks"):
        cp_unsplit([torch.zeros(4), torch.zeros(6)])
    with pytest.raises(ValueError, match="fit in 8"):
        segment_ids_from_lengths([[5, 4]], 8)


def test_rope_positions_keep_their_global_values():
    # reset-position-ids semantics: positions restart per document (6, then 10)
    positions = torch.cat([torch.arange(6), torch.arange(10)]).unsqueeze(0)
    assert cp_position_ids(positions, 0, 2).tolist() == [[0, 1, 2, 3, 6, 7, 8, 9]]
    assert cp_position_ids(positions, 1, 2).tolist() == [[4, 5, 0, 1, 2, 3, 4, 5]]
    with pytest.raises(ValueError, match=r"\[batch, seq\]"):
        cp_position_ids(torch.arange(16), 0, 2)


def test_segment_ids_and_local_document_runs():
    ids = segment_ids_from_lengths([[3, 7, 4], [16]], 16)
    assert ids[0].tolist() == [0] * 3 + [1] * 7 + [2] * 4 + [-1] * 2
    # rank 0 holds tokens 0-3 and 12-15: [0 0 0 1 | 2 2 -1 -1]; rank 1: 4-11 (document 1
    # crosses the chunk boundary: two runs); row 1 is one document (two runs per rank)
    assert cp_local_cu_seqlens(ids, 0, 2).tolist() == [0, 3, 4, 6, 7, 8, 12, 16]
    assert cp_local_cu_seqlens(ids, 1, 2).tolist() == [0, 4, 6, 8, 12, 16]


@pytest.mark.parametrize("size", [2, 3, 4])
def test_causal_balance_every_rank_computes_the_same_pairs(size):
    seq = 4 * size
    for rank in range(size):
        plan = cp_block_plan(None, seq, rank, size)
        assert len(plan) == size
        # own block: both diagonal pairs (masked) and late queries on early keys
        assert plan[0] == {(0, 0): "masked", (1, 0): "all", (1, 1): "masked"}
        # later steps: exactly half of the four pairs, all unmasked
        for step, entry in enumerate(plan[1:], 1):
            src = (rank - step) % size
            expected = {(0, 0): "all", (1, 0): "all"} if src < rank else \
                {(1, 0): "all", (1, 1): "all"}
            assert entry == expected, (rank, step)


def test_pair_masks_are_the_packed_mask_and_skip_whole_documents():
    seq, size = 32, 2
    ids = segment_ids_from_lengths([[5, 11, 1, 9], [8, 8, 8, 8]], seq)
    allowed = ~packed_causal_mask(ids)[:, 0]
    chunk = seq // (2 * size)
    for qc in range(2 * size):
        for kc in range(2 * size):
            block = allowed[:, qc * chunk:(qc + 1) * chunk, kc * chunk:(kc + 1) * chunk]
            mask = pair_mask(qc, kc, chunk, ids)
            if isinstance(mask, str):
                assert mask == ("all" if bool(block.all()) else "none")
                assert mask == "all" or not bool(block.any())
            else:
                assert torch.equal(mask[:, 0, 0], block)
    # documents of one chunk each: every off-diagonal pair is skipped
    aligned = segment_ids_from_lengths([[8, 8, 8, 8]], seq)
    for rank in range(size):
        plan = cp_block_plan(aligned, seq, rank, size)
        assert plan == cp_block_plan(aligned, seq, rank, size)  # deterministic
        assert plan[0] == {(0, 0): "masked", (1, 1): "masked"} and plan[1] == {}


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
def test_the_ring_is_safe_under_nccl_ordering(size):
    for backward in (False, True):
        plans = [ring_comm_plan(r, size, backward=backward) for r in range(size)]
        steps = size + 1 if backward and size > 1 else size
        assert check_ring_order(plans) == steps
        for plan in plans:  # K/V visit every other rank; dK/dV make the full circle
            sent = [payload for batch in plan for op, payload, _ in batch if op == "send"]
            assert sent.count("kv") == size - 1
            assert sent.count("dkv") == (size if backward and size > 1 else 0)


def test_a_misordered_ring_is_detected():
    size = 4
    plans = [ring_comm_plan(r, size, backward=True) for r in range(size)]
    # each rank receives before it sends (two batches): every rank waits on a receive
    # whose sender is itself blocked in a receive
    split = [[part for batch in plan for part in
              ([op for op in batch if op[0] == "recv"], [op for op in batch if op[0] == "send"])
              if part] for plan in plans]
    with pytest.raises(ScheduleError, match="deadlock"):
        check_ring_order(split)
    # one rank posts dK/dV before K/V: its neighbours would receive the wrong message
    swapped = [list(plan) for plan in plans]
    swapped[0][1] = sorted(plans[0][1], key=lambda op: (op[0], op[1] != "dkv"))
    with pytest.raises(ScheduleError, match="mismatch"):
        check_ring_order(swapped)
