"""ReplicatedDataParallel (``--dp-mode ddp``) over 2 gloo ranks, two units whose sizes do
not divide by dp (padded buckets and shards): 3 steps of 2 microbatches per replica
and one step of 1 and 2 (each unit's reduce-scatter starts after this replica's last weight
gradient of it, in one order on both replicas) equal single-process
AdamW on the whole batch, and every replica holds the same full parameters."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from odc_pp.testing.launch import LaunchConfig, run_workers

DP = 2
LR = 1e-2
COUNTS = [(2, 2), (2, 2), (2, 2), (1, 2)]
"""Microbatches per replica, per step."""


def make_units() -> list[nn.Module]:
    torch.manual_seed(3)
    return [nn.Linear(4, 3), nn.Linear(3, 1)]  # 15 and 4 elements


def sample(step: int, replica: int, index: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(100 * step + 10 * replica + index)
    return torch.randn(2, 4, generator=generator)


def loss_of(units, x):
    return units[1](torch.tanh(units[0](x))).pow(2).sum()


def worker(rank, world):
    from odc_pp.odc import primitives as prim
    from odc_pp.odc.ddp import ReplicatedDataParallel
    from odc_pp.odc.engine import OdcConfig
    from odc_pp.odc.sharded_optimizer import AdamWConfig, ShardedAdamW

    units = make_units()
    group = prim.new_group(config=prim.TransportConfig(backend="collective"))
    engine = ReplicatedDataParallel(units, OdcConfig(mode="ddp", unit_driver="pipeline"),
                                    group)
    optimizer = ShardedAdamW(engine, AdamWConfig(lr=LR, weight_decay=0.0), norm_group=None)
    early = []
    for step, counts in enumerate(COUNTS):
        engine.begin_minibatch(max_microbatches=max(counts), num_microbatches=counts[rank])
        for index in range(counts[rank]):
            for chunk in (0, 1):
                engine.before_forward(chunk, index)
            loss_of(units, sample(step, rank, index)).backward()
            for chunk in (1, 0):
                engine.after_weight_grad(chunk, index)
        early.append(list(engine._reduced))
        engine.finish_minibatch()
        optimizer.clip_and_step(None)
    params = [p.detach().clone().numpy() for unit in units for p in unit.parameters()]
    engine.destroy()
    group.destroy()
    dist.barrier()
    return {"params": params, "early": early}


def reference() -> list[torch.Tensor]:
    units = make_units()
    params = [p for unit in units for p in unit.parameters()]
    optimizer = torch.optim.AdamW(params, lr=LR, eps=1e-8, weight_decay=0.0)
    for step, counts in enumerate(COUNTS):
        optimizer.zero_grad()
        for replica, count in enumerate(counts):
            for index in range(count):
                loss_of(units, sample(step, replica, index)).backward()
        optimizer.step()
    return [p.detach() for p in params]


def test_ddp_engine_equals_single_process_adamw():
    results = run_workers(worker, DP, config=LaunchConfig(timeout_s=120))
    expected = reference()
    for rank, result in enumerate(results):
        for got, want in zip(result["params"], expected):
            torch.testing.assert_close(torch.from_numpy(got), want, rtol=1e-5, atol=1e-6)
        # every unit's reduce-scatter started before finish_minibatch, also in the step
        # with unequal counts (issued in one order on both replicas, so they pair up)
        assert result["early"] == [[True, True]] * len(COUNTS), result["early"]
    for a, b in zip(results[0]["params"], results[1]["params"]):
        assert (a == b).all()
