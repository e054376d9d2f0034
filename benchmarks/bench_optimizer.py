#!/usr/bin/env python3
"""The optimizer step (issue 29): :class:`~odc_pp.odc.sharded_optimizer.ShardedAdamW` over the
flat owned shards at dp=1 against ``torch.optim.AdamW(fused=True)`` (and the old per-tensor
``foreach=False`` loop) on the same parameters, one process, one thread, configurations
alternating round by round; median and spread of the per-round medians, with the load
average. CPU by default (``--device cuda`` on a GPU machine)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _model(hidden: int, layers: int, device) -> nn.Module:
    torch.manual_seed(0)
    blocks = []
    for _ in range(layers):
        blocks += [nn.Linear(hidden, 4 * hidden), nn.LayerNorm(4 * hidden),
                   nn.Linear(4 * hidden, hidden)]
    return nn.Sequential(*blocks).to(device)


def _time(step, steps: int, device) -> float:
    step()  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def _torch_step(model, **options):
    decay = [p for p in model.parameters() if p.dim() > 1]
    exempt = [p for p in model.parameters() if p.dim() <= 1]
    optimizer = torch.optim.AdamW([{"params": decay}, {"params": exempt, "weight_decay": 0.0}],
                                  lr=1e-4, weight_decay=0.1, **options)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    return optimizer.step


def _sharded_step(model, fused: bool):
    from odc_pp.odc import primitives as prim
    from odc_pp.odc.engine import OdcConfig, ShardedDataParallel
    from odc_pp.odc.sharded_optimizer import AdamWConfig, ShardedAdamW
    group = prim.new_group(None, config=prim.TransportConfig(backend="odc", timeout_s=60.0))
    engine = ShardedDataParallel(list(model), OdcConfig(mode="odc", param_dtype="float32"),
                                 group)
    optimizer = ShardedAdamW(engine, AdamWConfig(lr=1e-4, weight_decay=0.1, fused=fused,
                                                 no_decay=lambda name, shape: len(shape) <= 1))
    for grad in engine.owned_grads():
        grad.copy_(torch.randn_like(grad))
    return lambda: optimizer.step(finish=False)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--out", default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    device = torch.device(args.device)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    configs = {"torch_fused": lambda m: _torch_step(m, fused=True),
               "torch_foreach_false": lambda m: _torch_step(m, foreach=False),
               "sharded_fused": lambda m: _sharded_step(m, True),
               "sharded_foreach": lambda m: _sharded_step(m, False)}
    steps = {name: make(_model(args.hidden, args.layers, device))
             for name, make in configs.items()}
    rounds = {name: [] for name in configs}
    for _ in range(args.rounds):
        for name, step in steps.items():
            rounds[name].append(_time(step, args.steps, device))
    params = sum(p.numel() for p in _model(args.hidden, args.layers, "meta").parameters())
    base = statistics.median(rounds["torch_fused"])
    result = {"device": str(device), "params": params, "rounds": args.rounds,
              "load_average": os.getloadavg(),
              "step_ms": {n: 1e3 * statistics.median(r) for n, r in rounds.items()},
              "step_ms_range": {n: [1e3 * min(r), 1e3 * max(r)] for n, r in rounds.items()},
              "vs_torch_fused": {n: statistics.median(r) / base for n, r in rounds.items()}}
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=1)
    print(json.dumps(result) if args.json else json.dumps(result, indent=1))
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
