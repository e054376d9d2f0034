"""Megatron's ``--grad-reduce-in-bf16`` in the ODC engine (OdcConfig.main_grad_dtype): at
dp=2 each unit's local gradient is a bf16 ``main_grad`` (half the bytes of fp32), staged
by reference in the deterministic transport (no fp32 staging copy), and the owners' fp32
accumulators receive the bf16 sums: within bf16 rounding of the fp32 run's. CPU, gloo,
2 ranks; the unit test of the dp=1 path is tests/unit/odc/test_local_grads.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from odc_pp.odc import primitives as odc
from odc_pp.testing.launch import LaunchConfig, run_workers

pytestmark = pytest.mark.multiproc


def _owned_grads(rank: int, main_grad_dtype: str) -> dict:
    from odc_pp.odc.engine import OdcConfig, ShardedDataParallel

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 8)).to(torch.bfloat16)
    group = odc.new_group(config=odc.TransportConfig(timeout_s=60, deterministic=True))
    engine = ShardedDataParallel([model], OdcConfig(
        unit_driver="pipeline", param_dtype="bfloat16", main_grad_dtype=main_grad_dtype),
        group)
    unit = engine.units[0]
    generator = torch.Generator().manual_seed(10 + rank)
    engine.begin_minibatch()
    for microbatch in range(3):
        engine.before_forward(0, microbatch)
        x = torch.randn(4, 16, generator=generator).to(torch.bfloat16)
        model(x).float().square().sum().backward()
        engine.after_weight_grad(0, microbatch)
    staged = []
    apply = group.staged.apply  # record the staging bytes the sync finds
    group.staged.apply = lambda: (staged.append(group.staged.staged_bytes()), apply())
    engine.finish_minibatch()
    result = {"owned": engine.owned_grads()[0].tolist(), "main_grad": str(unit.main_grad.dtype),
              "main_grad_bytes": unit.main_grad.numel() * unit.main_grad.element_size(),
              "numel": unit.numel, "staged_at_sync": staged,
              "grads_left": sum(p.grad is not None for p in model.parameters())}
    engine.finish_step()
    engine.destroy()
    group.destroy()
    return result


def _worker(rank, world):
    return {dtype: _owned_grads(rank, dtype) for dtype in ("float32", "bfloat16")}


def test_bf16_main_grad_halves_the_buffer_and_sums_like_fp32():
    ranks = run_workers(_worker, 2, config=LaunchConfig(timeout_s=180))
    for result in ranks:
        fp32, bf16 = result["float32"], result["bfloat16"]
        assert fp32["main_grad"] == "torch.float32" and bf16["main_grad"] == "torch.bfloat16"
        assert bf16["main_grad_bytes"] == 2 * bf16["numel"] == fp32["main_grad_bytes"] // 2
        assert bf16["grads_left"] == 0 and max(bf16["staged_at_sync"]) == 0
        # three bf16 additions per rank: a few bf16 ulps of the fp32 sum
        owned_bf16, owned_fp32 = torch.tensor(bf16["owned"]), torch.tensor(fp32["owned"])
        torch.testing.assert_close(owned_bf16, owned_fp32, rtol=2e-2, atol=2e-2)
        assert not torch.equal(owned_bf16, owned_fp32)  # the sum really was bf16
