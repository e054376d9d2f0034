"""The minibatch planner's ``balanced`` mode (equal microbatch counts, cost-balanced replicas)
against the strided split, and its invariants."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from odc_pp.data.load_balance import AttentionCost, TokenCost, balance_equal_counts
from odc_pp.data.assignment import plan_minibatch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def long_tailed(seed: int, n: int = 32, cap: int = 4096) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.minimum(rng.lognormal(5.0, 1.2, size=n).astype(int) + 8, cap)


def _flat(plan):
    return sorted(i for replica in plan.microbatches for mb in replica for i in mb)


@pytest.mark.parametrize("replicas", [2, 3, 4])
@pytest.mark.parametrize("by_count", [None, 1, 2])
def test_balanced_gives_every_replica_the_same_microbatch_count(replicas, by_count):
    for seed in range(20):
        lengths = long_tailed(seed, n=24, cap=2048)  # two samples fit one microbatch
        plan = plan_minibatch(lengths, replicas, max_tokens=4096, mode="balanced",
                              samples_per_microbatch=by_count, min_microbatches=2)
        counts = {len(replica) for replica in plan.microbatches}
        assert len(counts) == 1, (seed, [len(r) for r in plan.microbatches])
        assert _flat(plan) == list(range(24))
        sizes = {sum(len(mb) for mb in replica) for replica in plan.microbatches}
        assert sizes == {24 // replicas}  # equal sample counts too
        assert all(int(lengths[mb].sum()) <= 4096 for r in plan.microbatches for mb in r)
        assert all(mb == sorted(mb) and mb for r in plan.microbatches for mb in r)
        if by_count is not None:
            assert counts == {-(-(24 // replicas) // by_count)}
        else:
            assert counts.pop() >= 2


def test_balanced_token_cap_forces_more_microbatches_on_every_replica():
    lengths = [600] * 6 + [100] * 2  # a replica: 600 + 100, 600, 600
    plan = plan_minibatch(lengths, 2, max_tokens=1000, mode="balanced", packed=True)
    assert [len(r) for r in plan.microbatches] == [3, 3]
    assert all(sum(lengths[i] for i in mb) <= 1000 for r in plan.microbatches for mb in r)
    # padded rows run count x longest: 600 + 100 pads to 1200 > 1000, so 4 each
    plan = plan_minibatch(lengths, 2, max_tokens=1000, mode="balanced")
    assert [len(r) for r in plan.microbatches] == [4, 4]
    assert all(len(mb) * max(lengths[i] for i in mb) <= 1000
               for r in plan.microbatches for mb in r)
    # uneven sample counts (9 over 2) still give equal microbatch counts
    plan = plan_minibatch(lengths + [50], 2, max_tokens=1000, mode="balanced")
    assert len({len(r) for r in plan.microbatches}) == 1
    assert sorted(sum(len(mb) for mb in r) for r in plan.microbatches) == [4, 5]


@pytest.mark.parametrize("cost", [TokenCost(), AttentionCost(quadratic_coef=1 / 1536)],
                         ids=["tokens", "attention"])
@pytest.mark.parametrize("replicas", [2, 4, 8])
def test_balanced_cost_imbalance_never_exceeds_the_strided_split(cost, replicas):
    better = 0
    for seed in range(40):
        lengths = long_tailed(seed, n=64)
        strided = plan_minibatch(lengths, replicas, max_tokens=4096, mode="none",
                                 samples_per_microbatch=1, cost_model=cost)
        balanced = plan_minibatch(lengths, replicas, max_tokens=4096, mode="balanced",
                                  samples_per_microbatch=1, cost_model=cost)
        assert balanced.imbalance <= strided.imbalance + 1e-12, seed
        better += balanced.imbalance < strided.imbalance - 0.01
    assert better >= 30


def test_balance_equal_counts_respects_counts_and_beats_strided():
    costs = [100, 1, 1, 1, 90, 1, 1, 1]
    parts = balance_equal_counts(costs, 2)
    assert sorted(len(p) for p in parts) == [4, 4]
    assert sorted(sum(costs[i] for i in p) for p in parts) == [93, 103]  # strided: 192 vs 4
    parts = balance_equal_counts(costs, 3, counts=[1, 3, 4])
    assert [len(p) for p in parts] == [1, 3, 4]
    assert sorted(i for p in parts for i in p) == list(range(8))
    with pytest.raises(ValueError, match="adding up"):
        balance_equal_counts(costs, 2, counts=[3, 3])


def test_balanced_bad_input_is_named():
    with pytest.raises(ValueError, match="multiple of 2"):
        plan_minibatch([5, 6, 7], 2, max_tokens=100, mode="balanced", samples_per_microbatch=1)
    with pytest.raises(ValueError, match="3 replicas"):
        plan_minibatch([5, 6], 3, max_tokens=100, mode="balanced")
    # 5 full-length samples over 2 replicas: 3 microbatches on one, at most 2 on the other
    with pytest.raises(ValueError, match="raise max_tokens"):
        plan_minibatch([100] * 5, 2, max_tokens=100, mode="balanced")
    with pytest.raises(ValueError, match="not one of"):
        plan_minibatch([5, 6], 2, max_tokens=100, mode="fair")


_PLAN_SCRIPT = """
import json, sys
import numpy as np
from odc_pp.data.load_balance import AttentionCost
from odc_pp.data.assignment import plan_minibatch
rng = np.random.default_rng(7)
lengths = np.minimum(rng.lognormal(5.0, 1.2, size=48).astype(int) + 8, 4096)
plans = [plan_minibatch(lengths, r, max_tokens=2048, mode="balanced", min_microbatches=2,
                        cost_model=AttentionCost(quadratic_coef=1e-3)).microbatches
         for r in (2, 3, 4)]
packed = [plan_minibatch(lengths, 2, max_tokens=4096, mode=mode, min_microbatches=2,
                         cost_model=AttentionCost(quadratic_coef=1e-3), packed=True).microbatches
          for mode in ("none", "lb-mini", "balanced")]
print(json.dumps(plans + packed))
"""


def test_balanced_and_packed_plans_are_the_same_in_every_process():
    """Two fresh interpreters (different hash seeds, like two ranks) and this one agree."""
    outputs = []
    for hash_seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed, PYTHONPATH=ROOT)
        run = subprocess.run([sys.executable, "-c", _PLAN_SCRIPT], capture_output=True,
                             text=True, env=env, cwd=ROOT, timeout=300)
        assert run.returncode == 0, run.stderr
        outputs.append(json.loads(run.stdout))
    rng = np.random.default_rng(7)
    lengths = np.minimum(rng.lognormal(5.0, 1.2, size=48).astype(int) + 8, 4096)
    here = [plan_minibatch(lengths, r, max_tokens=2048, mode="balanced", min_microbatches=2,
                           cost_model=AttentionCost(quadratic_coef=1e-3)).microbatches
            for r in (2, 3, 4)]
    here += [plan_minibatch(lengths, 2, max_tokens=4096, mode=mode, min_microbatches=2,
                            cost_model=AttentionCost(quadratic_coef=1e-3),
                            packed=True).microbatches
             for mode in ("none", "lb-mini", "balanced")]
    assert outputs[0] == outputs[1] == here


# ----- issue 22: microbatches cost what the runtime executes; packer cases from real bugs

def test_packer_seven_token_samples_under_a_cap_of_eight_get_eight_bins():
    """verl PR #7553: lengths [7]*8 with a token cap of 8: 8 bins, none over the cap."""
    from odc_pp.data import pack_microbatches, pack_padded

    for bins in (pack_microbatches(range(8), [7] * 8, 8),
                 pack_microbatches(range(8), [7] * 8, 8, TokenCost()),
                 pack_padded(range(8), [7] * 8, max_tokens=8)):
        assert len(bins) == 8 and all(sum(7 for _ in b) <= 8 for b in bins)
    for mode in ("lb-mini", "balanced", "none"):
        for packed in (False, True):
            plan = plan_minibatch([7] * 8, 2, max_tokens=8, mode=mode, packed=packed)
            assert sum(len(r) for r in plan.microbatches) == 8


@pytest.mark.parametrize("lengths", [[1000] + [1] * 8, [5, 5, 5, 5, 5, 5, 5, 5, 5],
                                     [4096, 4000, 3900, 1, 1, 1, 1, 1, 1]])
@pytest.mark.parametrize("packed", [False, True])
def test_nine_sequences_over_four_replicas_leave_none_empty(lengths, packed):
    """verl issue #6786 / PR #6869: 9 sequences over 4 ranks must not leave a rank empty."""
    plan = plan_minibatch(lengths, 4, max_tokens=8192, mode="lb-mini", packed=packed)
    assert all(plan.microbatches) and sorted(
        i for r in plan.microbatches for mb in r for i in mb) == list(range(9))
    plan = plan_minibatch(lengths, 4, max_tokens=8192, mode="lb-mini", packed=packed,
                          samples_per_microbatch=None if packed else 1)
    assert all(plan.microbatches)


def test_balanced_microbatch_counts_round_up_never_below_the_cap():
    """OpenRLHF PR #1287: 5 microbatches needed over 4 replicas round up to 8 (2 each),
    never down to 4 with a microbatch over the cap."""
    lengths = [900, 200, 500, 500, 500, 500, 500, 500]  # 900 + 200 needs 2 under 1000
    for packed in (False, True):
        plan = plan_minibatch(lengths, 4, max_tokens=1000, mode="balanced", packed=packed)
        assert [len(r) for r in plan.microbatches] == [2, 2, 2, 2]
        for replica in plan.microbatches:
            for mb in replica:
                size = sum(lengths[i] for i in mb) if packed else \
                    len(mb) * max(lengths[i] for i in mb)
                assert size <= 1000


def _long_tail(seed, n, longest=1024):
    rng = np.random.default_rng(seed)
    return [int(v) for v in np.minimum(rng.lognormal(4.5, 1.0, size=n).astype(int) + 16,
                                       longest)]


@pytest.mark.parametrize("per_replica", [2, 4, 8, 16])
def test_unpacked_lb_mini_costs_padding_and_never_loses_to_balanced(per_replica):
    """What the runtime executes (count x longest, plus attention): unpacked lb-mini's
    largest replica is never costlier than balanced's with the same micro-batch size,
    and the plan reports those padded costs."""
    from odc_pp.data import microbatch_cost

    cost = AttentionCost(quadratic_coef=1 / (6 * 256))
    for seed in range(6):
        lengths = _long_tail(seed, 2 * per_replica)
        array = np.asarray(lengths)
        for mbs in (1, 2, 4):
            if per_replica % mbs:
                continue
            kw = dict(max_tokens=mbs * 1024, cost_model=cost, samples_per_microbatch=mbs)
            lb = plan_minibatch(lengths, 2, mode="lb-mini", **kw)
            bal = plan_minibatch(lengths, 2, mode="balanced", **kw)
            assert all(len(mb) <= mbs for r in lb.microbatches for mb in r)
            assert max(lb.costs) <= max(bal.costs) * (1 + 1e-9)
            assert lb.costs == pytest.approx([sum(microbatch_cost(mb, array, cost)
                                                  for mb in r) for r in lb.microbatches])
            assert all(c >= sum(cost(array[mb]).sum() for mb in r) - 1e-9
                       for c, r in zip(lb.costs, lb.microbatches))


@pytest.mark.parametrize("segments", [False, True])
@pytest.mark.parametrize("per_replica", [2, 4, 8, 16])
def test_packed_lb_mini_never_loses_to_packed_balanced(per_replica, segments):
    """Packed rows (CPU's one mask per row, or per-document attention): lb-mini's largest
    replica is never costlier than balanced's under the same flags and cost model."""
    cost = AttentionCost(quadratic_coef=1 / (6 * 256))
    for seed in range(6):
        lengths = _long_tail(seed, 2 * per_replica)
        for cap, mbs in ((1024, 1), (2048, None)):
            kw = dict(max_tokens=cap, cost_model=cost, samples_per_microbatch=mbs,
                      packed=True, segment_attention=segments)
            lb = plan_minibatch(lengths, 2, mode="lb-mini", **kw)
            bal = plan_minibatch(lengths, 2, mode="balanced", **kw)
            assert max(lb.costs) <= max(bal.costs) * (1 + 1e-9)
            assert sorted(i for r in lb.microbatches for mb in r for i in mb) == \
                list(range(len(lengths)))


def test_packed_row_cost_is_the_row_length_under_one_mask():
    from odc_pp.data import microbatch_cost

    cost = AttentionCost(quadratic_coef=0.01)
    lengths = np.asarray([10, 20, 30])
    assert microbatch_cost([0, 1, 2], lengths, cost, packed=True) == pytest.approx(60 + 36)
    assert microbatch_cost([0, 1, 2], lengths, cost) == pytest.approx(3 * (30 + 9))


def test_fit_microbatch_costs_recovers_per_token_and_per_token_squared():
    from odc_pp.data import fit_microbatch_costs, microbatch_cost

    a, b = 3e-9, 2e-6
    groups = [[100], [200, 180], [400], [50, 50, 40, 30], [800]]
    lengths = np.asarray([100, 200, 180, 400, 50, 50, 40, 30, 800])
    index, linear, quadratic, times = 0, [], [], []
    for g in groups:
        sizes = lengths[index:index + len(g)]
        index += len(g)
        linear.append(len(sizes) * sizes.max())
        quadratic.append(len(sizes) * sizes.max() ** 2)
        times.append(a * quadratic[-1] + b * linear[-1])
    fitted = fit_microbatch_costs(linear, quadratic, times)
    assert (fitted.a, fitted.b) == (pytest.approx(a), pytest.approx(b))
    assert microbatch_cost([1, 2], lengths, fitted) == pytest.approx(times[1])
    with pytest.raises(ValueError):
        fit_microbatch_costs([1, 2], [1, 4], [0.0, -1.0])


def test_packed_lb_mini_picks_the_row_count_by_executed_cost():
    """Under the row-wide mask, attention-heavy costs want short rows, a per-row constant
    wants few rows, tokens alone pack fullest; the plan never costs more than fewest rows."""
    from odc_pp.data import FittedCost, pack_microbatches

    lengths = [100] * 8
    tokens = pack_microbatches(range(8), lengths, 400, TokenCost(), row_cost=True)
    assert len(tokens) == 2
    attention = pack_microbatches(range(8), lengths, 400, FittedCost(a=1.0, b=1.0),
                                  row_cost=True)
    assert len(attention) == 8
    overhead = pack_microbatches(range(8), lengths, 400, FittedCost(a=1e-6, b=1.0, c=1e4),
                                 row_cost=True)
    assert len(overhead) == 2
    for cost in (TokenCost(), AttentionCost(quadratic_coef=1 / 1536)):
        lb = plan_minibatch(_long_tail(1, 16), 2, max_tokens=2048, mode="lb-mini",
                            packed=True, cost_model=cost)
        assert all(sum(_long_tail(1, 16)[i] for i in mb) <= 2048
                   for r in lb.microbatches for mb in r)


def test_segment_attention_costs_a_packed_row_per_document():
    """CUDA's varlen / flex kernels attend per document: a packed row costs the sum of its
    samples' costs, so packing fullest is free; the dense kernel (CPU) costs the row."""
    from odc_pp.data import microbatch_cost, pack_microbatches

    cost = AttentionCost(quadratic_coef=0.01)
    lengths = np.asarray([10, 20, 30])
    assert microbatch_cost([0, 1, 2], lengths, cost, packed=True, segments=True) == \
        pytest.approx(60 + 0.01 * (100 + 400 + 900))
    rows = pack_microbatches(range(8), [100] * 8, 400, cost, row_cost=True, segments=True)
    assert len(rows) == 2
