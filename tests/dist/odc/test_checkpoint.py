"""Checkpoints of a plain ShardedDataParallel + ShardedAdamW pair through the one checkpoint
implementation (odc_pp/training/checkpoint/checkpointing.py, resharding.py): atomic saves, leftovers
of a crashed save, model mismatch, bf16 parameters with fp32 master weights restored
exactly. Resharding to another data-parallel size: tests/dist/odc/test_engine.py."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from odc_pp.testing.launch import LaunchConfig, run_workers


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
    import torch.distributed as dist

    from odc_pp.training.checkpoint.checkpointing import (CheckpointSaver, checkpoint_dir,
                                               latest_iteration)
    from odc_pp.training.checkpoint.resharding import restore_optimizer, sharded_state

    report = {}
    for dtype in ("float32", "bfloat16"):
        save = os.path.join(root, f"ckpt-{dtype}")
        units, engine, optimizer = build(dtype)
        saver = CheckpointSaver(save, keep=2, rank=rank, world_size=world, barrier=dist.barrier)
        train(units, engine, optimizer, rank, 2, getattr(torch, dtype))
        saver.save(2, sharded_state(engine, optimizer))
        first = state_of(engine, optimizer)
        train(units, engine, optimizer, rank, 1, getattr(torch, dtype))
        if rank == 0:  # a crashed later save leaves a partial temp dir behind
            os.makedirs(os.path.join(save, ".tmp_iter_0000003"), exist_ok=True)
            with open(os.path.join(save, ".tmp_iter_0000003", "rank_00000.pt"), "wb") as f:
                f.write(b"partial")
        torch.distributed.barrier()
        # the crash did not touch the complete checkpoint
        assert latest_iteration(save) == 2
        assert restore_optimizer(checkpoint_dir(save, 2), engine, optimizer, rank=rank) == 2
        restored = state_of(engine, optimizer)
        report[dtype] = all(torch.equal(a, b) for a, b in zip(first["params"], restored["params"])) \
            and all(torch.equal(a, b) for name in ("master", "exp_avg", "exp_avg_sq")
                    for a, b in zip(first[name], restored[name]))
        # a newer checkpoint: the new one wins, no temp dir remains
        train(units, engine, optimizer, rank, 1, getattr(torch, dtype))
        saver.save(3, sharded_state(engine, optimizer))
        assert latest_iteration(save) == 3
        assert restore_optimizer(checkpoint_dir(save, 3), engine, optimizer, rank=rank) == 3
        report[f"{dtype}_leftovers"] = sorted(os.listdir(save))
        engine.destroy()
        engine.group.destroy()
    units, engine, optimizer = build("float32", width=16)  # another model
    try:
        restore_optimizer(checkpoint_dir(os.path.join(root, "ckpt-float32"), 3), engine,
                          optimizer, rank=rank)
        report["mismatch"] = "loaded"
    except ValueError as error:
        report["mismatch"] = str(error)
    try:
        restore_optimizer(os.path.join(root, "missing"), engine, optimizer, rank=rank)
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
        assert report["float32_leftovers"] == ["iter_0000002", "iter_0000003", "latest"]
        assert report["bfloat16_leftovers"] == ["iter_0000002", "iter_0000003", "latest"]
        assert "different model" in report["mismatch"]
        assert "not a complete odc-pp checkpoint" in report["missing"]
