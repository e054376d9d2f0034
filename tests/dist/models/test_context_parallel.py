"""Context-parallel attention (odc_pp.megatron.context_parallel, cp_attention) against
full attention on one process, fp32 on gloo: the output and dQ/dK/dV of every rank's
load-balanced chunks within 1e-6, for causal rows, GQA, packed rows whose documents cross
chunk and rank boundaries (with padding), CP=2 and CP=4, the ring (p2p) and the all-to-all
(Ulysses, a2a), and through the megatron core-attention module with the group taken from
``pg_collection.cp``."""

import pytest
import torch

from odc_pp.testing.launch import LaunchConfig, run_workers

TOL = 1e-6
"""Absolute, or relative to the largest expected magnitude where that exceeds 1."""
SCALE = 0.25


def _inputs(batch, heads, groups, seq, dim, seed=0):
    generator = torch.Generator().manual_seed(seed)
    shapes = [(batch, heads, seq, dim), (batch, groups, seq, dim), (batch, groups, seq, dim),
              (batch, heads, seq, dim)]
    return [torch.randn(*shape, generator=generator, dtype=torch.float32) for shape in shapes]


def _reference(q, k, v, weight, segment_ids):
    """Full attention on one process (the K/V heads repeated, a dense boolean mask)."""
    from odc_pp.megatron.packed_attention import packed_causal_mask

    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    groups = q.shape[1] // k.shape[1]
    scores = q @ k.repeat_interleave(groups, 1).transpose(-1, -2) * SCALE
    seq = q.shape[2]
    blocked = packed_causal_mask(segment_ids) if segment_ids is not None else \
        torch.ones(seq, seq, dtype=torch.bool).triu(1)
    probs = torch.softmax(scores.masked_fill(blocked, float("-inf")), dim=-1)
    out = probs @ v.repeat_interleave(groups, 1)
    (out * weight).sum().backward()
    return out.detach(), q.grad, k.grad, v.grad


def _error(got, expected):
    """Largest difference, relative to the largest expected magnitude when that exceeds
    1 (dV sums up to 128 fp32 products per entry: its rounding is relative)."""
    return float((got - expected).abs().max()) / max(1.0, float(expected.abs().max()))


def _ring_worker(rank, size, cases):
    """Every case of ``cases`` (names of CASES) in one launch: spawning the ranks costs
    more than the attention."""
    import torch.distributed as dist

    from odc_pp.megatron.context_parallel import ulysses_attention

    q = torch.zeros(1, 3, 8 * size, 4)  # 3 heads: not divisible by 2 or 4
    with pytest.raises(ValueError, match="a2a needs the query heads"):
        ulysses_attention(q, q, q, group=dist.group.WORLD, scale=1.0)
    return {name: _ring_case(rank, size, *CASES[name][1:]) for name in cases}


def _ring_case(rank, size, shape, lengths, comm="p2p"):
    import torch.distributed as dist

    from odc_pp.megatron.context_parallel import cp_split, segment_ids_from_lengths
    from odc_pp.megatron.context_parallel import ring_attention, ulysses_attention

    batch, heads, groups, seq, dim = shape
    q, k, v, weight = _inputs(batch, heads, groups, seq, dim)
    segment_ids = segment_ids_from_lengths(lengths, seq) if lengths else None
    expected = _reference(q, k, v, weight, segment_ids)
    local = [cp_split(t, rank, size, dim=2).requires_grad_() for t in (q, k, v)]
    attention = ring_attention if comm == "p2p" else ulysses_attention
    out = attention(*local, group=dist.group.WORLD, scale=SCALE,
                         segment_ids=segment_ids)
    (out * cp_split(weight, rank, size, dim=2)).sum().backward()
    got = [out.detach()] + [t.grad for t in local]
    return [_error(g, cp_split(e, rank, size, dim=2)) for g, e in zip(got, expected)]


CASES = {
    "causal-cp2": (2, (2, 4, 4, 64, 16), None),
    "gqa-cp2": (2, (2, 4, 2, 64, 16), None),
    # documents crossing the 16-token chunks (and ranks), a one-token document, padding
    "packed-gqa-cp2": (2, (2, 4, 2, 64, 16), [[20, 7, 1, 30], [64]]),
    "causal-gqa-cp4": (4, (1, 4, 2, 128, 16), None),
    "packed-cp4": (4, (2, 2, 1, 64, 16), [[5, 18, 9, 25], [40, 3, 13]]),
    # all-to-all (Ulysses): heads and K/V heads divisible by CP
    "a2a-packed-gqa-cp2": (2, (2, 4, 2, 64, 16), [[20, 7, 1, 30], [64]], "a2a"),
    "a2a-causal-cp4": (4, (1, 8, 4, 64, 16), None, "a2a"),
}


@pytest.mark.parametrize("size", [2, 4])
def test_ring_attention_matches_full_attention(size):
    cases = [name for name, case in CASES.items() if case[0] == size]
    errors = run_workers(_ring_worker, size, cases, config=LaunchConfig(timeout_s=120))
    for rank, by_case in enumerate(errors):
        for name in cases:
            for what, error in zip(("out", "dq", "dk", "dv"), by_case[name]):
                assert error <= TOL, f"{name}: rank {rank} {what}: {error:.2e}"


def _module_worker(rank, size):
    import torch.distributed as dist
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.transformer_config import TransformerConfig

    from odc_pp.megatron.compat import prepare_megatron_for_device

    prepare_megatron_for_device("cpu")
    own = [dist.new_group([r]) for r in range(size)][rank]
    groups = ProcessGroupCollection(tp=own, pp=own, cp=dist.group.WORLD, embd=own,
                                    pos_embd=own, mp=own, tp_cp=own, dp=own, dp_cp=own)
    config = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4,
                               num_query_groups=2, kv_channels=16, attention_dropout=0.0,
                               context_parallel_size=size)
    _module_refusals(groups, config)
    return [_module_case(rank, size, groups, config, packed, comm, dropout)
            for packed in (False, True) for comm in ("p2p", "a2a") for dropout in (0.0, 0.1)]


def _module_refusals(groups, config):
    from megatron.core.transformer.enums import AttnMaskType

    from odc_pp.megatron.compat import causal_mask
    from odc_pp.megatron.cp_attention import ContextParallelDotProductAttention

    with pytest.raises(ValueError, match="--cp-comm-type must be one of"):
        ContextParallelDotProductAttention(config, 1, AttnMaskType.causal, "self",
                                           cp_comm_type="allgather", pg_collection=groups)
    module = ContextParallelDotProductAttention(config, 1, AttnMaskType.causal, "self",
                                                pg_collection=groups)
    x = torch.zeros(32, 2, 4, 16)
    with pytest.raises(ValueError, match="not a dense mask"):
        module(x, x[:, :, :2], x[:, :, :2], causal_mask(32, "cpu"))


def _module_case(rank, size, groups, config, packed, comm, dropout):
    """Output and input gradients of the CP module against megatron's unfused attention
    on the full rows; with ``dropout`` both key their masks by the same global token ids
    (odc_pp.megatron.dropout: the host attention's keyed subclass on the full rows)."""
    import contextlib
    import dataclasses

    from odc_pp.data import row_token_ids
    from odc_pp.megatron.dropout import KEYED_ATTENTION, dropout_scope

    from megatron.core.transformer.enums import AttnMaskType

    from odc_pp.megatron.compat import HostDotProductAttention, causal_mask
    from odc_pp.megatron.context_parallel import cp_split, segment_ids_from_lengths
    from odc_pp.megatron.cp_attention import ContextParallelDotProductAttention
    from odc_pp.megatron.packed_attention import PackedSegments

    seq, batch = 64, 2
    generator = torch.Generator().manual_seed(1)
    query = torch.randn(seq, batch, 4, 16, generator=generator)
    key, value = (torch.randn(seq, batch, 2, 16, generator=generator) for _ in range(2))
    segments = PackedSegments(segment_ids_from_lengths([[9, 30, 20], [33, 31]], seq), "cpu") \
        if packed else None
    weight = torch.randn(seq, batch, 64, generator=generator)
    config = dataclasses.replace(config, attention_dropout=dropout)
    ids = row_token_ids(batch, seq, first_sample=5)

    def scope(full):
        if not dropout:
            return contextlib.nullcontext()
        return dropout_scope(seed=3, token_ids=ids if full else cp_split(ids, rank, size, dim=1),
                             full_token_ids=None if full else ids)

    host = KEYED_ATTENTION[HostDotProductAttention] if dropout else HostDotProductAttention
    reference = host(dataclasses.replace(config, context_parallel_size=1),
                     1, AttnMaskType.causal, "self", pg_collection=groups)
    full = [t.clone().requires_grad_() for t in (query, key, value)]
    with scope(True):
        expected = reference(*full, segments if packed else causal_mask(seq, "cpu"))
    (expected * weight).sum().backward()
    module = ContextParallelDotProductAttention(config, 1, AttnMaskType.causal, "self",
                                                cp_comm_type=comm, pg_collection=groups)
    local = [cp_split(t, rank, size).requires_grad_() for t in (query, key, value)]
    with scope(False):
        got = module(*local, segments)
    (got * cp_split(weight, rank, size)).sum().backward()
    if dropout:  # the masks are on: without them the output differs
        with torch.no_grad():
            plain = HostDotProductAttention(dataclasses.replace(
                config, context_parallel_size=1, attention_dropout=0.0), 1,
                AttnMaskType.causal, "self", pg_collection=groups)(
                query, key, value, segments if packed else causal_mask(seq, "cpu"))
        assert _error(expected.detach(), plain) > 1e-2
    pairs = [(got, expected)] + [(mine.grad, whole.grad) for mine, whole in zip(local, full)]
    return max(_error(mine.detach(), cp_split(whole.detach(), rank, size))
               for mine, whole in pairs)


def test_core_attention_module_uses_the_cp_group():
    """Causal and packed rows through the megatron module (GQA, CP=2, p2p and a2a)
    against megatron's unfused attention (HostDotProductAttention) on the full rows,
    without and with keyed attention dropout 0.1 (the same masks on both)."""
    errors = run_workers(_module_worker, 2, config=LaunchConfig(timeout_s=120))
    assert max(max(e) for e in errors) <= TOL, errors
