"""ShardedAdamW runs torch's fused multi-tensor AdamW kernel over the flat owned shards
(issue 29): on the same gradients it gives ``torch.optim.AdamW(fused=True)``'s weights, with
weight decay exempting the 1-D parameters, and one kernel call per decay setting, not one
per tensor."""

import json

import pytest
import torch
from torch import nn

from odc_pp.testing.launch import run_workers

LR, BETAS, EPS, WD, STEPS = 1e-2, (0.9, 0.95), 1e-8, 0.1, 3


def _model() -> nn.Sequential:
    torch.manual_seed(7)
    return nn.Sequential(nn.Linear(12, 16), nn.LayerNorm(16), nn.Linear(16, 8))


def _grads(step: int, params) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(100 + step)
    return [torch.randn(p.shape, generator=generator) for p in params]


def worker(rank, world_size, out_path):
    from odc_pp.odc import primitives as prim
    from odc_pp.odc.engine import OdcConfig, ShardedDataParallel
    from odc_pp.odc.sharded_optimizer import AdamWConfig, ShardedAdamW

    reference = _model()
    decay = [p for p in reference.parameters() if p.dim() > 1]
    exempt = [p for p in reference.parameters() if p.dim() <= 1]
    torch_adamw = torch.optim.AdamW([{"params": decay}, {"params": exempt, "weight_decay": 0.0}],
                                    lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, fused=True)
    model = _model()
    group = prim.new_group(None, config=prim.TransportConfig(backend="odc", timeout_s=60.0))
    engine = ShardedDataParallel([model], OdcConfig(mode="odc", param_dtype="float32"), group)
    optimizer = ShardedAdamW(engine, AdamWConfig(
        lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, no_decay=lambda name, shape: len(shape) <= 1))
    calls, fused = [], torch._fused_adamw_
    for step in range(STEPS):
        for p, g in zip(reference.parameters(), _grads(step, list(reference.parameters()))):
            p.grad = g
        torch_adamw.step()
        (grad,) = engine.owned_grads()
        grad.copy_(torch.cat([g.flatten() for g in _grads(step, list(model.parameters()))]))
        torch._fused_adamw_ = lambda *a, **k: (calls.append(len(a[0])), fused(*a, **k))[1]
        try:
            optimizer.step()
        finally:
            torch._fused_adamw_ = fused
    got = {k.split(".", 1)[1]: v for k, v in engine.full_state_dict().items()}  # "unit.name"
    want = dict(reference.named_parameters())
    error = max(float((got[k].float() - want[k].detach()).abs().max()) for k in want)
    with open(out_path, "w") as handle:
        json.dump({"error": error, "calls": calls, "keys": sorted(got) == sorted(want)}, handle)
    engine.destroy()
    group.destroy()


@pytest.mark.multiproc
def test_sharded_adamw_is_torchs_fused_adamw(tmp_path):
    out = tmp_path / "adamw.json"
    run_workers(worker, 1, str(out))
    result = json.loads(out.read_text())
    assert result["keys"]
    assert result["error"] == 0.0, result  # the same kernel on the same numbers
    # per step: one call over the decayed pieces (the two weight matrices), one over the
    # exempt runs (bias; LayerNorm weight + bias + bias merged; last bias), not per tensor
    assert result["calls"] == [2, 2] * STEPS, result
