import numpy as np
import pytest

from odc_pp.training.arguments import parse_args
from odc_pp.training.data_plan import BatchAssigner, build_source


def planner(extra, *, dp, pp=1):
    args = parse_args(["--mock-data", "--vocab-size", "64", "--seq-length", "64",
                       "--global-batch-size", "8"] + extra)
    source, vocab = build_source(args)
    assert vocab == 64
    return BatchAssigner(args, source, dp=dp, pp=pp)


@pytest.mark.parametrize("extra", [[], ["--load-balance", "lb-mini"],
                                   ["--max-tokens-per-microbatch", "128"],
                                   ["--micro-batch-size", "2"],
                                   ["--load-balance", "balanced"],
                                   ["--load-balance", "balanced", "--micro-batch-size", "2"],
                                   ["--load-balance", "balanced",
                                    "--max-tokens-per-microbatch", "128"]])
def test_every_sample_runs_once_and_tokens_add_up(extra):
    one = planner(extra, dp=1).plan(3)
    two = planner(extra, dp=2, pp=2).plan(3)
    ids = sorted(i for replica in two.replicas for mb in replica for i in mb)
    assert ids == list(range(24, 32))
    assert sorted(i for replica in one.replicas for mb in replica for i in mb) == ids
    assert one.total_loss_tokens == two.total_loss_tokens
    p = planner(extra, dp=2, pp=2)
    scored = sum(float(mb.loss_mask.sum()) for replica in two.replicas
                 for mb in p.microbatches(replica))
    assert scored == two.total_loss_tokens
    for replica in two.replicas:
        assert len(replica) >= 2  # a pipeline of 2 needs 2 microbatches


def test_lb_mini_balances_tokens_better_than_equal_count():
    worse = better = 0
    for iteration in range(20):
        plans = [planner(x, dp=2).plan(iteration) for x in ([], ["--load-balance", "lb-mini"])]
        spread = []
        for plan, p in zip(plans, (planner([], dp=2), planner([], dp=2))):
            loads = [sum(p.source.length(i) for mb in r for i in mb) for r in plan.replicas]
            spread.append(max(loads) - min(loads))
        better += spread[1] < spread[0]
        worse += spread[1] > spread[0]
    assert better > 10 and worse == 0


def test_microbatches_have_variable_lengths():
    p = planner([], dp=1)
    plan = p.plan(0)
    shapes = {tuple(mb.tokens.shape) for mb in p.microbatches(plan.replicas[0])}
    assert len(shapes) > 2 and all(s[1] <= 64 for s in shapes)


@pytest.mark.parametrize("extra", [[], ["--max-tokens-per-microbatch", "128"]])
def test_balanced_has_equal_microbatch_counts_and_beats_strided(extra):
    better = 0
    for iteration in range(20):
        for dp in (2, 4):
            p = planner(["--load-balance", "balanced"] + extra, dp=dp, pp=2)
            plan = p.plan(iteration)
            assert len({len(replica) for replica in plan.replicas}) == 1
            assert plan.max_microbatches >= 2
            strided = planner(extra, dp=dp, pp=2).plan(iteration)
            loads = [[sum(p.source.length(i) for mb in r for i in mb) for r in x.replicas]
                     for x in (plan, strided)]
            assert max(loads[0]) <= max(loads[1])
            better += max(loads[0]) < max(loads[1])
    assert better > 20


PACKED_MODES = [[], ["--load-balance", "lb-mini"], ["--max-tokens-per-microbatch", "128"],
                ["--micro-batch-size", "2"], ["--load-balance", "balanced"],
                ["--load-balance", "lb-mini", "--max-tokens-per-microbatch", "96"]]


@pytest.mark.parametrize("extra", PACKED_MODES)
def test_packing_keeps_samples_and_loss_tokens(extra):
    unpacked = planner(extra, dp=2, pp=2)
    packed = planner(extra + ["--pack-sequences"], dp=2, pp=2)
    for iteration in (0, 3):
        plain, plan = unpacked.plan(iteration), packed.plan(iteration)
        ids = sorted(i for replica in plan.replicas for mb in replica for i in mb)
        assert ids == list(range(8 * iteration, 8 * iteration + 8))
        assert plan.total_loss_tokens == plain.total_loss_tokens
        assert plan.total_tokens == plain.total_tokens
        scored = 0.0
        for replica in plan.replicas:
            assert len(replica) >= 2
            for group, mb in zip(replica, packed.microbatches(replica)):
                lengths = [packed.source.length(i) for i in group]
                assert tuple(mb.tokens.shape) == (1, sum(lengths)) <= (1, packed.token_cap)
                assert mb.segment_ids[0].bincount().tolist() == lengths
                assert mb.position_ids[0].tolist() == [p for n in lengths for p in range(n)]
                scored += float(mb.loss_mask.sum())
        assert scored == plan.total_loss_tokens


def test_packed_lb_mini_uses_the_attention_cost_of_the_flops_formula():
    p = planner(["--load-balance", "lb-mini", "--pack-sequences", "--hidden-size", "32",
                 "--ffn-hidden-size", "96"], dp=2)
    assert p.cost_model.quadratic_coef == pytest.approx(1 / (2 * 32 + 96))
    # one cost model for every mode and path, packed or padded
    for extra in (["--load-balance", "lb-mini", "--no-pack-sequences"],
                  ["--load-balance", "balanced"]):
        assert planner(extra + ["--hidden-size", "32", "--ffn-hidden-size", "96"],
                       dp=2).cost_model == p.cost_model


def test_lb_mini_packs_by_default_and_flags_choose(tmp_path):
    assert planner(["--load-balance", "lb-mini"], dp=2).packed
    assert not planner(["--load-balance", "lb-mini", "--no-pack-sequences"], dp=2).packed
    assert not planner(["--load-balance", "balanced"], dp=2).packed
    with pytest.raises(ValueError, match="contradict"):
        planner(["--pack-sequences", "--no-pack-sequences"], dp=2)
    path = tmp_path / "cost.json"
    path.write_text('{"a": 2e-9, "b": 1e-6}')
    p = planner(["--load-balance", "balanced", "--sample-cost-model", str(path)], dp=2)
    assert (p.cost_model.a, p.cost_model.b) == (2e-9, 1e-6)
    path.write_text('{"b": 1e-6}')
    with pytest.raises(ValueError, match="--sample-cost-model"):
        planner(["--sample-cost-model", str(path)], dp=2)


def test_unpacked_lb_mini_respects_micro_batch_size_and_costs_padding():
    """The issue-22 bug: unpacked lb-mini grouped by summed tokens, ignored
    --micro-batch-size, and the runtime padded every row to its longest sample."""
    p = planner(["--load-balance", "lb-mini", "--no-pack-sequences", "--micro-batch-size", "2",
                 "--global-batch-size", "16"], dp=2)
    for iteration in range(5):
        plan = p.plan(iteration)
        assert all(len(mb) <= 2 for r in plan.replicas for mb in r)


def test_packed_rows_are_the_same_on_every_rank():
    """What each rank builds on its own (the plan itself is checked across processes in
    tests/unit/data/test_assignment.py): the same packed rows from fresh planners."""
    digests = []
    for _ in range(2):
        p = planner(["--load-balance", "lb-mini", "--pack-sequences"], dp=2, pp=2)
        rows = []
        for iteration in range(3):
            plan = p.plan(iteration)
            rows.append(plan.replicas)
            for replica in plan.replicas:
                for mb in p.microbatches(replica):
                    rows.append([t.tolist() for t in (mb.tokens, mb.labels, mb.loss_mask,
                                                      mb.position_ids, mb.segment_ids)])
        digests.append(rows)
    assert digests[0] == digests[1]


def test_packed_microbatch_flops_count_each_sample_alone():
    from odc_pp.data import Sample, collate, pack
    from odc_pp.training.throughput import ModelShape, flops_per_microbatch, microbatch_flops

    shape = ModelShape(num_layers=2, hidden_size=32, ffn_hidden_size=128, vocab_size=64)
    samples = [Sample(tokens=np.arange(n + 1), loss_mask=np.ones(n, np.float32))
               for n in (5, 9, 2)]
    assert microbatch_flops(shape, pack(samples)) == \
        sum(flops_per_microbatch(shape, 1, n) for n in (5, 9, 2))
    assert microbatch_flops(shape, collate(samples, pad_id=0)) == \
        flops_per_microbatch(shape, 3, 9)
