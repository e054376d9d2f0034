"""--decoupled-lr: ShardedAdamW steps the ``AdamWConfig.decoupled`` parameters (here an
embedding and an output layer) at the decoupled rate of each step's StepRates and the
rest at the main rate -- torch.optim.AdamW with one param group per (decay, rate) pair,
fed the two rates of the same LRSchedule (warmup then cosine), gives the same weights."""

import json

import pytest
import torch
from torch import nn

from odc_pp.testing.launch import run_workers

BETAS, EPS, WD, STEPS = (0.9, 0.95), 1e-8, 0.1, 4


def _model() -> nn.Sequential:
    torch.manual_seed(5)
    return nn.Sequential(nn.Embedding(10, 12), nn.Linear(12, 16), nn.LayerNorm(16),
                         nn.Linear(16, 10))


def _decoupled(name: str, shape) -> bool:
    return name.split(".")[0] in ("0", "3")  # the embedding and the output layer


def _grads(step: int, params) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(200 + step)
    return [torch.randn(p.shape, generator=generator) for p in params]


def worker(rank, world_size, out_path):
    from odc_pp.odc import primitives as prim
    from odc_pp.odc.engine import OdcConfig, ShardedDataParallel
    from odc_pp.odc.sharded_optimizer import AdamWConfig, ShardedAdamW
    from odc_pp.training.lr_schedule import LRSchedule

    schedule = LRSchedule(lr=1e-2, min_lr=1e-3, warmup_iters=2, decay_iters=STEPS,
                          decoupled_lr=5e-2, decoupled_min_lr=2e-3)
    reference = _model()
    groups = {}
    for name, param in reference.named_parameters():
        key = (param.dim() > 1, _decoupled(name, param.shape))
        groups.setdefault(key, []).append(param)
    torch_adamw = torch.optim.AdamW(
        [{"params": params, "weight_decay": WD if decayed else 0.0, "decoupled": decoupled}
         for (decayed, decoupled), params in groups.items()],
        lr=1.0, betas=BETAS, eps=EPS, fused=True)
    model = _model()
    group = prim.new_group(None, config=prim.TransportConfig(backend="odc", timeout_s=60.0))
    engine = ShardedDataParallel([model], OdcConfig(mode="odc", param_dtype="float32"), group)
    optimizer = ShardedAdamW(engine, AdamWConfig(
        lr=1.0, betas=BETAS, eps=EPS, weight_decay=WD,
        no_decay=lambda name, shape: len(shape) <= 1, decoupled=_decoupled))
    rates = []
    for step in range(STEPS):
        lr = schedule.lr_at(step)
        rates.append([float(lr), lr.decoupled])
        for param_group in torch_adamw.param_groups:
            param_group["lr"] = lr.decoupled if param_group["decoupled"] else float(lr)
        for p, g in zip(reference.parameters(), _grads(step, list(reference.parameters()))):
            p.grad = g
        torch_adamw.step()
        (grad,) = engine.owned_grads()
        grad.copy_(torch.cat([g.flatten() for g in _grads(step, list(model.parameters()))]))
        optimizer.step(lr=lr)
    got = {k.split(".", 1)[1]: v for k, v in engine.full_state_dict().items()}  # "unit.name"
    want = dict(reference.named_parameters())
    start = dict(_model().named_parameters())
    error = max(float((got[k].float() - want[k].detach()).abs().max()) for k in want)
    with open(out_path, "w") as handle:
        json.dump({"error": error, "rates": rates, "keys": sorted(got) == sorted(want),
                   "moved": {k: float((got[k] - start[k].detach()).abs().max())
                             for k in want}}, handle)
    engine.destroy()
    group.destroy()


@pytest.mark.multiproc
def test_decoupled_parameters_step_at_the_decoupled_rate(tmp_path):
    out = tmp_path / "decoupled.json"
    run_workers(worker, 1, str(out))
    result = json.loads(out.read_text())
    assert result["keys"]
    assert result["error"] <= 1e-6, result
    assert all(main != decoupled for main, decoupled in result["rates"]), result
    # the first step's Adam update is about lr per element: the decoupled parameters
    # moved by the decoupled rate (2.5e-2 at warmup step 0), the others by --lr (5e-3)
    first_main, first_decoupled = result["rates"][0]
    assert first_decoupled == pytest.approx(2.5e-2) and first_main == pytest.approx(5e-3)
    assert result["moved"]["0.weight"] > 5 * result["moved"]["1.weight"], result
