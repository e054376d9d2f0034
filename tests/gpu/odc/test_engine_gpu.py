"""ShardedDataParallel on CUDA (two processes sharing the GPU, or two GPUs) against the
single-process CPU AdamW reference of test_engine.py: exercises the CUDA prefetch (an async
gather issued from the compute stream), pushes with peer atomics, the staged path
(deterministic mode, and ``peer_atomics="never"``, the fallback for GPUs without native
peer atomics) and the collective CUDA destroy. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from odc_pp.testing.launch import LaunchConfig, run_workers
from tests.dist.odc.test_engine import (BETAS, EPS, LR, STEPS, WD, make_model, make_plan,
                                   microbatch_loss, reference_params, rel_diff, sample_lengths)

pytestmark = [pytest.mark.gpu, pytest.mark.multiproc]

GPU_REL_TOL = 1e-4
"""CUDA kernels sum in another order than the CPU reference; Adam amplifies that a little."""


def _worker(rank, world, deterministic, peer_atomics):
    from odc_pp.odc import primitives as prim
    from odc_pp.odc.engine import OdcConfig, ShardedDataParallel
    from odc_pp.odc.sharded_optimizer import AdamWConfig, ShardedAdamW

    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    group = prim.new_group(config=prim.TransportConfig(
        deterministic=deterministic, peer_atomics=peer_atomics, timeout_s=60.0))
    model = make_model().to(device)
    engine = ShardedDataParallel(model.units(), OdcConfig(
        mode="odc", keep_params_through_backward=False), group)
    optimizer = ShardedAdamW(engine, AdamWConfig(lr=LR, betas=BETAS, eps=EPS, weight_decay=WD))
    for step in range(STEPS):
        plan = make_plan(step, world)
        global_tokens = sum(sample_lengths(step))
        engine.begin_minibatch(max_microbatches=max(len(r) for r in plan))
        for indices in plan[rank]:
            microbatch_loss(model, step, indices, global_tokens, device=device).backward()
        engine.finish_minibatch()
        optimizer.step()
    params = {k: v.cpu().numpy() for k, v in engine.full_state_dict().items()}
    engine.destroy()
    group.destroy()
    return params


@pytest.mark.parametrize("deterministic,peer_atomics",
                         [(False, "auto"), (True, "auto"), (False, "never")])
def test_cuda_engine_matches_cpu_reference(deterministic, peer_atomics):
    ranks = run_workers(_worker, 2, deterministic, peer_atomics,
                        config=LaunchConfig(timeout_s=300))
    reference = reference_params(STEPS, 2, clip=None)
    for params in ranks:
        assert rel_diff(params, reference) <= GPU_REL_TOL
    for key, value in ranks[0].items():
        assert (value == ranks[1][key]).all(), key
