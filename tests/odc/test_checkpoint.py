"""Sharded checkpoints: atomic replacement, leftovers of a crashed save, model mismatch,
bf16 parameters with fp32 master weights restored exactly."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from odc_pp.odc.launch import LaunchConfig, run_workers


def make_units(dtype: torch.dtype, width: int = 12) -> list[nn.Module]:
    torch.manual_seed(7)
    return [nn.Sequential(nn.Linear(width, 2 * width), nn.GELU()).to(dtype),
            nn.Linear(2 * width, 5).to(dtype)]


def build(dtype: str, width: int = 12):
    from odc_pp.odc import primitives as prim
    from odc_pp.odc.engine import OdcConfig, ShardedDataParallel
    from odc_pp.odc.sharded_optimizer import AdamWConfig, ShardedAdamW

    units = make_units(getattr(torch, dtype), width)
    group = prim.new_group(None, config=prim.TransportConfig(backend="odc"))
    engine = ShardedDataParallel(units, OdcConfig(param_dtype=dtype), group)
    return units, engine, ShardedAdamW(engine, AdamWConfig(lr=1e-2))


def train(units, engine, optimizer, rank, steps, dtype):
    for step in range(steps):
        gen = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(3 + rank, 12, generator=gen).to(dtype)
        engine.begin_minibatch()
        units[1](units[0](x)).float().pow(2).sum().backward()
        engine.finish_minibatch()
        optimizer.step()


def state_of(engine, optimizer) -> dict:
    return {"params": [t.clone() for t in engine.owned_params()],
            **{k: v for k, v in optimizer.state_dict().items()}}


def worker(rank, world, root):
    from odc_pp.odc.checkpoint import load_checkpoint, save_checkpoint

    path = os.path.join(root, "ckpt")
    report = {}
    for dtype in ("float32", "bfloat16"):
        units, engine, optimizer = build(dtype)
        train(units, engine, optimizer, rank, 2, getattr(torch, dtype))
        save_checkpoint(path, optimizer)
        first = state_of(engine, optimizer)
        train(units, engine, optimizer, rank, 1, getattr(torch, dtype))
        if rank == 0:  # a crashed later save leaves a partial temp dir behind
            os.makedirs(path + ".tmp", exist_ok=True)
            with open(os.path.join(path + ".tmp", "shard-00000-of-00002.pt"), "wb") as f:
                f.write(b"partial")
        torch.distributed.barrier()
        # the crash did not touch the complete checkpoint
        assert load_checkpoint(path, optimizer) == 2
        restored = state_of(engine, optimizer)
        report[dtype] = all(torch.equal(a, b) for a, b in zip(first["params"], restored["params"])) \
            and all(torch.equal(a, b) for name in ("master", "exp_avg", "exp_avg_sq")
                    for a, b in zip(first[name], restored[name]))
        # replacing an existing checkpoint: the new one wins, no temp or old dir remains
        train(units, engine, optimizer, rank, 1, getattr(torch, dtype))
        save_checkpoint(path, optimizer)
        assert load_checkpoint(path, optimizer) == 3
        report[f"{dtype}_leftovers"] = sorted(os.listdir(root))
        engine.destroy()
        engine.group.destroy()
    units, engine, optimizer = build("float32", width=16)  # another model
    try:
        load_checkpoint(path, optimizer)
        report["mismatch"] = "loaded"
    except ValueError as error:
        report["mismatch"] = str(error)
    try:
        load_checkpoint(os.path.join(root, "missing"), optimizer)
        report["missing"] = "loaded"
    except ValueError as error:
        report["missing"] = str(error)
    engine.destroy()
    engine.group.destroy()
    return report


@pytest.mark.multiproc
def test_checkpoint_atomic_exact_and_checked(tmp_path):
    reports = run_workers(worker, 2, str(tmp_path), config=LaunchConfig(timeout_s=180))
    for report in reports:
        assert report["float32"] and report["bfloat16"]
        assert report["float32_leftovers"] == ["ckpt"]
        assert report["bfloat16_leftovers"] == ["ckpt"]
        assert "different model" in report["mismatch"]
        assert "not a complete odc-pp checkpoint" in report["missing"]
