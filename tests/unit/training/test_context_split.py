"""Context parallelism in training without processes: the flags' checks, the rank layout
and groups, and each CP rank's share of a microbatch."""

import pytest
import torch

from odc_pp.data.microbatch import Microbatch
from odc_pp.megatron.context_parallel import cp_unsplit
from odc_pp.training.arguments import parse_args
from odc_pp.training.context_split import cp_pad_multiple, split_microbatch
from odc_pp.layout import layout_rank, topology_groups

BASE = ["--mock-data", "--vocab-size", "64", "--num-attention-heads", "4"]


def test_cp_flags_are_native_and_divide_the_world():
    args = parse_args(BASE + ["--context-parallel-size", "2", "--cp-comm-type", "a2a",
                              "--global-batch-size", "4"])
    assert (args.parallel.context_parallel_size, args.parallel.cp_comm_type) == (2, "a2a")
    assert args.resolve(8).layout.dp == 4
    assert parse_args(BASE + ["--context-parallel-size", "2", "--global-batch-size", "4",
                              "--pipeline-model-parallel-size", "2", "--num-layers", "2"]
                      ).resolve(8).layout.dp == 2
    with pytest.raises(ValueError, match="--context-parallel-size 2"):
        parse_args(BASE + ["--context-parallel-size", "2"]).resolve(3).layout.dp


def test_the_layout_refuses_hierarchical_with_context_parallelism():
    """The rule lives in the layout: the parse passes, resolving the job refuses it."""
    args = parse_args(BASE + ["--context-parallel-size", "2", "--dp-mode", "hierarchical"])
    with pytest.raises(ValueError, match="--context-parallel-size 2 needs --dp-mode odc"):
        args.resolve(4)


@pytest.mark.parametrize("flags,needle", [
    (["--cp-comm-type", "a2a", "--context-parallel-size", "8"], "--cp-comm-type a2a"),
    (["--cp-comm-type", "ring"], "--cp-comm-type 'ring' is not one of"),
    (["--cp-comm-type", "allgather"], "--cp-comm-type allgather is not implemented"),
    (["--context-parallel-size", "0"], "--context-parallel-size must be >= 1"),
    (["--dynamic-context-parallel"], "--dynamic-context-parallel needs --load-balance lb-mini"),
    (["--dynamic-context-parallel", "--context-parallel-size", "1"],
     "--dynamic-context-parallel needs --context-parallel-size > 1"),
])
def test_cp_refusals_name_the_flag(flags, needle):
    cp = [] if "--context-parallel-size" in flags else ["--context-parallel-size", "2"]
    with pytest.raises(ValueError, match=needle):
        parse_args(BASE + cp + flags)


def test_cp_one_changes_nothing():
    assert parse_args(BASE + ["--pack-sequences", "--context-parallel-size", "2"]
                      ).data.pack_sequences
    assert parse_args(BASE + ["--cp-comm-type", "a2a+p2p"]).parallel.cp_comm_type == "a2a+p2p"
    assert topology_groups(pp=2, tp=2, dp=2) == topology_groups(pp=2, tp=2, dp=2, cp=1)
    assert cp_pad_multiple(context_parallel_size=1, multiple=3) == 3
    assert cp_pad_multiple(context_parallel_size=2, multiple=3) == 12


def test_layout_is_tp_cp_pp_dp_and_groups_partition_the_world():
    tp, cp, pp, dp = 2, 2, 2, 2
    groups = topology_groups(pp=pp, tp=tp, dp=dp, cp=cp)
    assert layout_rank(dp_rank=0, pp_rank=0, tp_rank=1, pp=pp, tp=tp, cp=cp, cp_rank=0) == 1
    assert layout_rank(dp_rank=0, pp_rank=0, tp_rank=0, pp=pp, tp=tp, cp=cp, cp_rank=1) == 2
    assert layout_rank(dp_rank=0, pp_rank=1, tp_rank=0, pp=pp, tp=tp, cp=cp, cp_rank=0) == 4
    assert layout_rank(dp_rank=1, pp_rank=0, tp_rank=0, pp=pp, tp=tp, cp=cp, cp_rank=0) == 8
    world = list(range(tp * cp * pp * dp))
    for kind, size in (("tp", tp), ("cp", cp), ("pp", pp), ("dp", dp), ("dp-cp", dp * cp)):
        assert all(len(g) == size for g in groups[kind]), kind
        assert sorted(r for g in groups[kind] for r in g) == world, kind
    assert groups["cp"][0] == [0, 2] and groups["dp-cp"][0] == [0, 2, 8, 10]


def test_split_keeps_global_positions_and_unsplits():
    tokens = torch.arange(16).view(2, 8)
    mb = Microbatch(tokens=tokens, labels=tokens + 1, loss_mask=(tokens % 3 > 0).float())
    parts = [split_microbatch(mb, rank, 2) for rank in range(2)]
    assert parts[0].tokens.tolist()[0] == [0, 1, 6, 7]
    assert parts[1].position_ids.tolist()[1] == [2, 3, 4, 5]
    for name in ("tokens", "labels", "loss_mask"):
        whole = cp_unsplit([getattr(p, name) for p in parts], dim=1)
        assert torch.equal(whole, getattr(mb, name)), name
    assert split_microbatch(mb, 0, 1) is mb
    packed = split_microbatch(Microbatch(tokens=tokens, segment_ids=tokens // 3), 1, 2)
    assert packed.segment_ids is None and torch.equal(packed.full_segment_ids, tokens // 3)
    assert parts[0].full_segment_ids is None
    with pytest.raises(ValueError, match="--context-parallel-size 3"):
        split_microbatch(mb, 0, 3)  # 8 tokens are not 6 equal chunks



@pytest.mark.parametrize("flags,needle", [
    (["--context-parallel-size", "2", "--seq-length", "50"],
     "--seq-length 50 is not a multiple of 4 (--context-parallel-size 2 splits every sequence "
     "into 2 x 2 chunks): microbatches are padded up to 52 positions, past the learned "
     "position table (--max-position-embeddings 50). Give --seq-length 48 or 52"),
    (["--context-parallel-size", "2", "--seq-length", "47"], "Give --seq-length 44 or 48 "),
    (["--tensor-model-parallel-size", "2", "--sequence-parallel", "--seq-length", "47"],
     "--seq-length 47 is not a multiple of 2 (--sequence-parallel splits it over "
     "--tensor-model-parallel-size 2): microbatches are padded up to 48 positions"),
    (["--context-parallel-size", "2", "--seq-length", "50", "--max-position-embeddings", "50"],
     "Give --seq-length 48 (the nearest multiples of 4), --max-position-embeddings 52 or more"),
])
def test_a_length_that_cp_or_sp_pads_past_the_position_table_is_refused(flags, needle):
    """Issue 53 item 6: these lengths ended in IndexError at iteration 2 (padding pushed
    the position ids past the learned table)."""
    with pytest.raises(ValueError) as caught:
        parse_args(BASE + flags)
    assert needle in str(caught.value)


@pytest.mark.parametrize("flags", [
    ["--context-parallel-size", "2", "--seq-length", "48"],
    ["--context-parallel-size", "2", "--seq-length", "50", "--max-position-embeddings", "52"],
    ["--context-parallel-size", "2", "--seq-length", "50", "--position-embedding-type", "rope"],
    ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--seq-length", "46"],
])
def test_lengths_whose_padding_fits_the_position_table_are_accepted(flags):
    args = parse_args(BASE + flags)
    multiple = cp_pad_multiple(context_parallel_size=args.parallel.context_parallel_size,
                               multiple=2 if args.parallel.sequence_parallel else 1)
    padded = -(-args.model.seq_length // multiple) * multiple
    assert args.model.position_embedding_type == "rope" or \
        padded <= args.model.max_position_embeddings
