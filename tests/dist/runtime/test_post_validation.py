"""PostValidatedOptimizer on 2 stages (fp32 and bf16, AdamW) against synchronous steps."""

import json

import pytest
import torch
import torch.distributed as dist

from odc_pp.testing.launch import LaunchConfig, run_workers

DTYPES = ["float32", "bfloat16"]


def _params(rank, dtype):
    generator = torch.Generator().manual_seed(100 + rank)
    return [torch.nn.Parameter(torch.randn(shape, generator=generator).to(dtype))
            for shape in ((8, 4), (5,))]


def _grads(rank, step, dtype, scale):
    generator = torch.Generator().manual_seed(1000 * step + rank)
    return [(torch.randn(shape, generator=generator) * scale).to(dtype)
            for shape in ((8, 4), (5,))]


def _sync_step(params, optimizer, grads, max_norm, skip):
    """Reference: synchronous global inf check and clipping, then step."""
    for param, grad in zip(params, grads):
        param.grad = grad.clone()
    local = torch.tensor([sum(float(g.double().pow(2).sum()) for g in grads)],
                         dtype=torch.float64)
    dist.all_reduce(local)
    if skip:
        return
    norm = float(local.sqrt())
    if norm > max_norm:
        for param in params:
            param.grad.mul_(max_norm / (norm + 1e-6))
    optimizer.step()


def worker(rank, world_size, out_path):
    from odc_pp.runtime import PostValidatedOptimizer, PostValidationConfig

    report = {}
    for dtype_name in DTYPES:
        dtype = getattr(torch, dtype_name)
        params = _params(rank, dtype)
        reference = _params(rank, dtype)
        optimizer = torch.optim.AdamW(params, lr=1e-2)
        ref_optimizer = torch.optim.AdamW(reference, lr=1e-2)
        wrapped = PostValidatedOptimizer(PostValidationConfig(max_grad_norm=3.0),
                                         optimizer=optimizer, group=dist.group.WORLD)
        actions, max_diffs = [], []
        # step 0: accepted; 1: inf on rank 1 only -> skipped everywhere; 2: clipped
        plan = [(0.1, False), (0.1, True), (10.0, False)]
        for step, (scale, inject) in enumerate(plan):
            grads = _grads(rank, step, dtype, scale)
            if inject and rank == 1:
                grads[0][2, 3] = float("inf")
            for param, grad in zip(params, grads):
                param.grad = grad.clone()
            wrapped.step()
            wrapped.zero_grad()  # the next minibatch may start before validation
            outcome = wrapped.validate()
            actions.append(outcome.action)
            _sync_step(reference, ref_optimizer, grads, 3.0, skip=inject)
            max_diffs.append(max(float((p.float() - r.float()).abs().max())
                                 for p, r in zip(params, reference)))
            state_equal = all(
                torch.equal(optimizer.state[p][k], ref_optimizer.state[r][k])
                for p, r in zip(params, reference) for k in optimizer.state.get(p, {}))
            max_diffs.append(0.0 if state_equal else 1.0)
        report[dtype_name] = {"actions": actions, "max_diffs": max_diffs,
                              "grads_cleared": all(p.grad is None for p in params)}
    with open(f"{out_path}.{rank}", "w") as handle:
        json.dump(report, handle)


@pytest.mark.multiproc
def test_rollback_and_clipping_match_synchronous(tmp_path):
    out = tmp_path / "pv"
    run_workers(worker, 2, str(out), config=LaunchConfig(timeout_s=120))
    for rank in range(2):
        report = json.loads((tmp_path / f"pv.{rank}").read_text())
        for dtype_name in DTYPES:
            entry = report[dtype_name]
            assert entry["actions"] == ["accepted", "skipped", "clipped"], entry
            assert entry["max_diffs"] == [0.0] * 6, entry  # bit-exact params and state
            assert entry["grads_cleared"], entry


def test_config_rejects_bad_values():
    from odc_pp.runtime import PostValidationConfig

    with pytest.raises(ValueError, match="max_grad_norm"):
        PostValidationConfig(max_grad_norm=0.0)
