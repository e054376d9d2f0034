"""PostValidatedOptimizer over ODC's ShardedAdamW on pp=2 x dp=2 processes (gloo).

Every rank owns a shard of its stage's parameters; the global grad norm and inf flag are
reduced over the data-parallel group and then the pipeline group. Against a synchronous
reference on the same ranks (same reduction, check before the step): an inf injected on
one rank skips the step on every rank (parameters equal the skipped-step reference and
the previous step's), and a step over the clip norm ends with the parameters and AdamW
state of synchronous clipping -- bit for bit, in fp32 and bf16.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

from odc_pp.testing.launch import LaunchConfig, run_workers
from odc_pp.optim import clip

PP, DP = 2, 2
HIDDEN = 12
MAX_NORM = 1.0
# per step: (loss scale, inject inf on rank 3); expected outcome
PLAN = [(0.05, False), (0.05, True), (50.0, False), (0.05, False)]
EXPECTED = ["accepted", "skipped", "clipped", "accepted"]


def _layout(rank):
    return rank % PP, rank // PP  # (stage, replica), as the training frontend lays ranks out


def _groups(rank):
    """(dp group, pp group) of ``rank``; every rank creates every group in one order."""
    dp_group = pp_group = None
    for stage in range(PP):
        group = dist.new_group([replica * PP + stage for replica in range(DP)])
        if stage == _layout(rank)[0]:
            dp_group = group
    for replica in range(DP):
        group = dist.new_group([replica * PP + stage for stage in range(PP)])
        if replica == _layout(rank)[1]:
            pp_group = group
    return dp_group, pp_group


def _build(rank, dtype, dp_group):
    from odc_pp.odc import primitives as prim
    from odc_pp.odc.engine import OdcConfig, ShardedDataParallel
    from odc_pp.odc.sharded_optimizer import AdamWConfig, ShardedAdamW

    stage, _ = _layout(rank)
    torch.manual_seed(100 + stage)  # replicas of a stage start equal
    model = nn.Sequential(nn.Linear(HIDDEN, 2 * HIDDEN), nn.GELU(),
                          nn.Linear(2 * HIDDEN, HIDDEN)).to(getattr(torch, dtype))
    # deterministic: accumulation order fixed, so both runs are comparable bit for bit
    group = prim.new_group(dp_group, config=prim.TransportConfig(
        backend="odc", deterministic=True, timeout_s=60.0))
    engine = ShardedDataParallel([model[0], model[2]], OdcConfig(mode="odc", param_dtype=dtype),
                                 group, process_group=dp_group)
    optimizer = ShardedAdamW(engine, AdamWConfig(lr=1e-2, betas=(0.9, 0.95),
                                                 weight_decay=0.1))
    return model, engine, optimizer


def _accumulate(rank, model, engine, step, dtype):
    """One minibatch of two microbatches; inf into one owned gradient when planned."""
    scale, inject = PLAN[step]
    engine.begin_minibatch(max_microbatches=2)
    for microbatch in range(2):
        generator = torch.Generator().manual_seed(1000 * step + 10 * rank + microbatch)
        inputs = torch.randn(5, HIDDEN, generator=generator).to(getattr(torch, dtype))
        (model(inputs).float().pow(2).mean() * scale).backward()
    engine.finish_minibatch()
    if inject and rank == PP * DP - 1:
        engine.owned_grads()[0][0] = float("inf")


def _sync_step(optimizer, engine, groups):
    """Reference: the global check first, then skip, clip or step."""
    local = float(optimizer.local_grad_norm_sq().double())
    finite = not clip.has_nonfinite(engine.owned_grads())
    state = torch.tensor([local if finite else 0.0, 0.0 if finite else 1.0],
                         dtype=torch.float64)
    for group in groups:
        dist.all_reduce(state, group=group)
    if state[1] > 0:
        engine.finish_step()
        return
    coefficient = MAX_NORM / (float(state[0]) ** 0.5 + 1e-6)
    if coefficient < 1.0:
        for grad in engine.owned_grads():
            grad.mul_(coefficient)
    optimizer.step()


def _run(rank, dtype, groups, post_validated):
    from odc_pp.optim.post_validation import PostValidatedOptimizer, PostValidationConfig

    model, engine, optimizer = _build(rank, dtype, groups[0])
    wrapped = PostValidatedOptimizer(PostValidationConfig(max_grad_norm=MAX_NORM),
                                     optimizer=optimizer, group=list(groups))
    assert wrapped.target is optimizer  # ShardedAdamW is a PostValidationTarget itself
    params, states, actions = [], [], []
    for step in range(len(PLAN)):
        _accumulate(rank, model, engine, step, dtype)
        if post_validated:
            wrapped.step()
            actions.append(wrapped.validate().action)
        else:
            _sync_step(optimizer, engine, groups)
        params.append({k: v.numpy() for k, v in engine.full_state_dict().items()})
        states.append({k: [t.numpy() for t in v] if isinstance(v, list) else v
                       for k, v in optimizer.state_dict().items()})
    engine.destroy()
    engine.group.destroy()
    return {"params": params, "states": states, "actions": actions}


def worker(rank, world):
    groups = _groups(rank)
    return {dtype: {"pv": _run(rank, dtype, groups, True),
                    "sync": _run(rank, dtype, groups, False)}
            for dtype in ("float32", "bfloat16")}


def _equal(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return np.array_equal(a, b)


@pytest.mark.multiproc
def test_sharded_rollback_and_clipping_match_synchronous():
    ranks = run_workers(worker, PP * DP, config=LaunchConfig(timeout_s=180))
    for rank, result in enumerate(ranks):
        for dtype, runs in result.items():
            pv, sync = runs["pv"], runs["sync"]
            assert pv["actions"] == EXPECTED, (rank, dtype, pv["actions"])
            for step in range(len(PLAN)):
                assert _equal(pv["params"][step], sync["params"][step]), (rank, dtype, step)
                assert _equal(pv["states"][step], sync["states"][step]), (rank, dtype, step)
            # the skipped step left every parameter of every rank as after step 0
            assert _equal(pv["params"][1], pv["params"][0]), (rank, dtype)
            assert pv["states"][1]["step"] == 1
            assert not _equal(pv["params"][2], pv["params"][1])


def test_rejects_an_unknown_optimizer():
    from odc_pp.optim.post_validation import PostValidatedOptimizer, PostValidationConfig

    with pytest.raises(ValueError, match="cannot post-validate"):
        PostValidatedOptimizer(PostValidationConfig(), optimizer=object())
