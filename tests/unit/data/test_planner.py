"""The minibatch planner's ``balanced`` mode (equal microbatch counts, cost-balanced replicas)
against the strided split, and its invariants."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from odc_pp.data.load_balance import AttentionCost, TokenCost, balance_equal_counts
from odc_pp.data.planner import plan_minibatch

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
    plan = plan_minibatch(lengths, 2, max_tokens=1000, mode="balanced")
    assert [len(r) for r in plan.microbatches] == [3, 3]
    assert all(sum(lengths[i] for i in mb) <= 1000 for r in plan.microbatches for mb in r)
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
from odc_pp.data.planner import plan_minibatch
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
