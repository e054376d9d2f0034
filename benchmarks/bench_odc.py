"""ODC vs per-layer collectives vs PyTorch FSDP2 on a long-tailed workload (CPU, gloo).

dp=2 local processes train the same stack of transformer blocks on the same global
minibatches, in one run:

* ``odc``        ShardedDataParallel, one-sided transport (waits once per minibatch)
* ``collective`` ShardedDataParallel, all-gather / reduce-scatter per unit (FSDP pattern)
* ``fsdp2``      ``torch.distributed.fsdp.fully_shard`` per block

each under the three plans of :func:`odc_pp.data.plan_minibatch` (``--load-balance``):

* ``none``      the strided equal-count split, one sample per microbatch,
* ``lb-mini``   replicas balanced by an attention-aware cost, any microbatch count per
  replica, packed under a token cap (collective and FSDP2 pad the replica with fewer
  microbatches: zero-gradient replays for ``collective``, a 1-token dummy for FSDP2),
* ``balanced``  the fair baseline of per-layer-collective systems (verl, slime, OpenRLHF):
  replicas balanced by the same cost with equal microbatch counts, no padding needed.

The headline is ODC + LB-Mini against collective + balanced and FSDP2 + balanced. A
balanced workload (all sequences the same length) checks the overhead. Every
configuration lives in one run and they take turns step by step (each measured step is a
round; the order rotates between rounds), so the ratios are measured side by side. Two
ranks with one thread each (ranks <= cores). Step time is the slowest rank's, median with
min-max over the rounds, next to the 1-minute load average before each round;
utilisation is a rank's compute time for its own microbatches (timed on an unsharded copy
of the model, one rank at a time) over the step time.

    python benchmarks/bench_odc.py --json [--out benchmarks/results/odc_cpu.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from odc_pp.testing.bench import emit, load_1min, rotated, spread  # noqa: E402
from odc_pp.testing.launch import LaunchConfig, run_workers  # noqa: E402
from odc_pp.data import AttentionCost, plan_minibatch  # noqa: E402


@dataclass(kw_only=True)
class Settings:
    """Benchmark shape."""

    hidden: int = 256
    """Model width."""
    heads: int = 4
    """Attention heads."""
    layers: int = 4
    """Transformer blocks (one sharding unit each, plus the head)."""
    samples: int = 32
    """Samples per global minibatch."""
    max_tokens: int = 1024
    """Token cap of a microbatch, and the longest sample."""
    steps: int = 5
    """Measured steps per configuration (after one warm-up step)."""
    seed: int = 0
    """Data seed."""


class Block(nn.Module):
    """Pre-norm transformer block on packed sequences (``x``: [tokens, hidden])."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.norm2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        tokens, hidden = x.shape
        qkv = self.qkv(self.norm1(x)).view(tokens, 3, self.heads, hidden // self.heads)
        outs = []
        for piece in torch.split(qkv, lengths):  # varlen attention: one sample at a time
            q, k, v = piece.permute(1, 2, 0, 3)
            outs.append(F.scaled_dot_product_attention(q, k, v).transpose(0, 1))
        x = x + self.proj(torch.cat(outs).reshape(tokens, hidden))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class Stack(nn.Module):
    def __init__(self, settings: Settings) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.blocks = nn.ModuleList(Block(settings.hidden, settings.heads)
                                    for _ in range(settings.layers))
        self.head = nn.Linear(settings.hidden, settings.hidden)

    def units(self) -> list[nn.Module]:
        return [*self.blocks, self.head]

    def forward(self, x: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, lengths)
        return self.head(x)


def workload_lengths(settings: Settings, step: int, balanced: bool) -> list[int]:
    if balanced:
        return [settings.max_tokens // 4] * settings.samples
    rng = np.random.default_rng(settings.seed * 1000 + step)
    lengths = rng.lognormal(4.3, 1.1, size=settings.samples).astype(int) + 16
    return [int(v) for v in np.minimum(lengths, settings.max_tokens)]


PLANS = ("none", "lb-mini", "balanced")


def make_plan(settings: Settings, lengths: list[int], world: int, mode: str):
    """[replica][microbatch] -> sample indices, from the one planner of odc_pp.data."""
    cost = AttentionCost(quadratic_coef=1.0 / (6 * settings.hidden))
    return plan_minibatch(lengths, world, max_tokens=settings.max_tokens, mode=mode,
                          cost_model=cost,
                          samples_per_microbatch=1 if mode == "none" else None).microbatches


def microbatch_loss(model, settings, step, lengths, indices, global_tokens) -> torch.Tensor:
    sizes = [lengths[i] for i in indices]
    gen = torch.Generator().manual_seed(step * 100_003 + indices[0])
    x = torch.randn(sum(sizes), settings.hidden, generator=gen)
    return model(x, sizes).pow(2).sum() / global_tokens


def dummy_loss(model, settings) -> torch.Tensor:
    return model(torch.zeros(1, settings.hidden), [1]).sum() * 0.0


# ----- one configuration on one rank -----------------------------------------------------

def build_system(system: str, settings: Settings):
    model = Stack(settings)
    if system == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for unit in model.units():
            fully_shard(unit, mesh=mesh)
        fully_shard(model, mesh=mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
        return model, None, optimizer
    from odc_pp.odc import primitives as prim
    from odc_pp.odc.engine import OdcConfig, ShardedDataParallel
    from odc_pp.odc.sharded_optimizer import AdamWConfig, ShardedAdamW
    group = prim.new_group(None, config=prim.TransportConfig(backend=system, timeout_s=120.0))
    engine = ShardedDataParallel(model.units(), OdcConfig(
        mode=system, keep_params_through_backward=False), group)
    return model, engine, ShardedAdamW(engine, AdamWConfig(lr=1e-4))


def run_step(system, model, engine, optimizer, settings, step, lengths, plan, rank) -> None:
    """One minibatch: this rank's microbatches, the data-parallel finish, the update."""
    global_tokens = sum(lengths)
    max_microbatches = max(len(replica) for replica in plan)
    if engine is not None:
        engine.begin_minibatch(max_microbatches=max_microbatches)
    for indices in plan[rank]:
        microbatch_loss(model, settings, step, lengths, indices, global_tokens).backward()
    if engine is None:
        for _ in range(max_microbatches - len(plan[rank])):
            dummy_loss(model, settings).backward()  # FSDP2 needs equal counts
        optimizer.step()
        optimizer.zero_grad()
    else:
        engine.finish_minibatch()
        optimizer.step()


def busy_seconds(settings, step, lengths, indices_per_mb) -> float:
    """Compute time of this rank's own microbatches on an unsharded model."""
    model = _PLAIN.setdefault("model", Stack(settings))
    start = time.perf_counter()
    for indices in indices_per_mb:
        microbatch_loss(model, settings, step, lengths, indices, sum(lengths)).backward()
    elapsed = time.perf_counter() - start
    model.zero_grad(set_to_none=True)
    return elapsed


_PLAIN: dict = {}


def config_key(workload: str, system: str, mode: str) -> str:
    return f"{workload}/{system}/{mode}"


def measure_busy(rank, world, settings, step, workload, mode) -> float:
    """This rank's compute time for its microbatches, one rank at a time."""
    lengths = workload_lengths(settings, step, workload == "balanced")
    plan = make_plan(settings, lengths, world, mode)
    busy = 0.0
    for turn in range(world):  # no contention between the two ranks while timing
        dist.barrier()
        if turn == rank:
            busy = busy_seconds(settings, step, lengths, plan[rank])
    dist.barrier()
    return busy


def worker(rank, world, settings: Settings, configs) -> dict:
    """All configurations live at once and take turns step by step (rotating the order),
    so a slow spell of this shared machine hits every configuration alike."""
    torch.set_num_threads(1)
    systems = {config_key(*c): build_system(c[1], settings) for c in configs}
    step_times = {config_key(*c): [] for c in configs}
    busy_times = {(workload, mode): [] for workload, _, mode in configs}
    loads = []
    for step in range(settings.steps + 1):
        if step > 0:
            loads.append(load_1min())
        for workload, system, mode in rotated(configs, step):
            key = config_key(workload, system, mode)
            lengths = workload_lengths(settings, step, workload == "balanced")
            plan = make_plan(settings, lengths, world, mode)
            dist.barrier()
            start = time.perf_counter()
            run_step(system, *systems[key], settings, step, lengths, plan, rank)
            if step > 0:  # step 0 warms up
                step_times[key].append(time.perf_counter() - start)
        if step > 0:
            for workload, mode in busy_times:
                busy_times[(workload, mode)].append(
                    measure_busy(rank, world, settings, step, workload, mode))
    for _, engine, _ in systems.values():
        if engine is not None:
            engine.destroy()
            engine.group.destroy()
    return {"load_1min": loads} | {config_key(workload, system, mode): {
        "step_times": step_times[config_key(workload, system, mode)],
        "busy_times": busy_times[(workload, mode)],
        "microbatches": [len(r) for r in make_plan(
            settings, workload_lengths(settings, 1, workload == "balanced"), world, mode)]}
        for workload, system, mode in configs}


CONFIGS = [("imbalanced", system, mode)
           for system in ("odc", "collective", "fsdp2") for mode in PLANS] + [
    ("balanced", "odc", "none"), ("balanced", "collective", "none"),
    ("balanced", "fsdp2", "none")]
HEADLINE = "imbalanced/odc/lb-mini"


def summarize(per_rank: list[dict]) -> dict:
    summary = {}
    for key in (k for k in per_rank[0] if k != "load_1min"):
        steps = [max(times) for times in zip(*(r[key]["step_times"] for r in per_rank))]
        step_time = statistics.median(steps)
        summary[key] = {
            "step_time_s": round(step_time, 4),
            "step_times_s": [round(t, 4) for t in steps],
            "step_time_spread": spread(steps),
            "utilisation_per_rank": [round(statistics.median(r[key]["busy_times"]) / step_time, 3)
                                     for r in per_rank],
            "microbatches_per_rank_step1": per_rank[0][key]["microbatches"],
        }
    return summary


def speedups(summary: dict) -> dict:
    def time_of(key):
        return summary[key]["step_time_s"]
    out = {}
    best_odc = time_of(HEADLINE)
    for key in summary:
        if key.startswith("imbalanced/") and key != HEADLINE:
            out[f"imbalanced: {key.split('/', 1)[1]} / odc+lb-mini"] = round(
                time_of(key) / best_odc, 3)
    for other in ("collective", "fsdp2"):
        out[f"balanced: {other} / odc"] = round(
            time_of(f"balanced/{other}/none") / time_of("balanced/odc/none"), 3)
    return out


def same_plan_ratios(summary: dict) -> dict:
    """ODC against each baseline under the same plan: what the transport alone buys."""
    return {f"imbalanced {mode}: {other} / odc": round(
        summary[f"imbalanced/{other}/{mode}"]["step_time_s"]
        / summary[f"imbalanced/odc/{mode}"]["step_time_s"], 3)
        for mode in PLANS for other in ("collective", "fsdp2")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--out", default=None, help="also write the JSON to this file")
    parser.add_argument("--steps", type=int, default=Settings.steps,
                        help="measured rounds (>= 3) after one warm-up step")
    parser.add_argument("--layers", type=int, default=Settings.layers)
    parser.add_argument("--hidden", type=int, default=Settings.hidden)
    parser.add_argument("--samples", type=int, default=Settings.samples)
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args(argv)
    settings = Settings(steps=args.steps, layers=args.layers, hidden=args.hidden,
                        samples=args.samples)
    start = time.perf_counter()
    per_rank = run_workers(worker, 2, settings, CONFIGS,
                           config=LaunchConfig(timeout_s=args.timeout))
    summary = summarize(per_rank)
    result = {"benchmark": "bench_odc", "dp": 2, "device": "cpu (gloo, 1 thread per rank)",
              "settings": asdict(settings), "load_1min_per_round": per_rank[0]["load_1min"],
              "results": summary,
              "speedup_vs_odc_lb_mini": speedups(summary),
              "same_plan_speedup_of_odc": same_plan_ratios(summary),
              "wall_s": round(time.perf_counter() - start, 1)}
    emit(result, out=args.out, as_json=args.json)
    if not args.json:
        for key, value in summary.items():
            print(f"{key:32s} step {value['step_time_s']:.3f} s  util "
                  f"{value['utilisation_per_rank']}")
        for key, value in {**result["speedup_vs_odc_lb_mini"],
                           **result["same_plan_speedup_of_odc"]}.items():
            print(f"{key:45s} {value:.3f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
