"""ShardedDataParallel on a megatron-core GPTModel with one unit per decoder layer (module
hooks driver), dp=2 in odc and collective modes with different microbatch counts, against
single-process torch.optim.AdamW on the same global minibatches."""

from __future__ import annotations

import math

import pytest
import torch

from odc_pp.testing.launch import LaunchConfig, run_workers

MODEL = dict(vocab_size=64, hidden_size=32, num_layers=3, num_attention_heads=4,
             max_sequence_length=32)
STEPS = 5
LR, BETAS, EPS, WD = 3e-3, (0.9, 0.95), 1e-8, 0.1


def sample_lengths(step: int) -> list[int]:
    generator = torch.Generator().manual_seed(900 + step)
    return [28] + torch.randint(3, 16, (6,), generator=generator).tolist()


def make_sample(step: int, index: int, length: int):
    from odc_pp.data import Microbatch

    generator = torch.Generator().manual_seed(7000 * step + index)
    tokens = torch.randint(0, MODEL["vocab_size"], (1, length), generator=generator)
    labels = torch.randint(0, MODEL["vocab_size"], (1, length), generator=generator)
    return Microbatch(tokens=tokens, labels=labels)


def replica_plan(step: int, num_replicas: int) -> list[list[int]]:
    from odc_pp.data.load_balance import AttentionCost, balance_minibatch

    return balance_minibatch(sample_lengths(step), num_replicas,
                             AttentionCost(quadratic_coef=0.05))


def layer_units(chunk) -> list[torch.nn.Module]:
    """Forward order of a full GPTModel: embedding, each layer, final norm, output layer."""
    gpt = chunk.model
    return [gpt.embedding, *gpt.decoder.layers, gpt.decoder.final_layernorm, gpt.output_layer]


def worker(rank, world):
    from odc_pp.training.distributed import standalone_process_groups
    from odc_pp.megatron.model import ModelConfig, build_chunks
    from odc_pp.odc import primitives as prim
    from odc_pp.odc.engine import OdcConfig, ShardedDataParallel
    from odc_pp.odc.sharded_optimizer import AdamWConfig, ShardedAdamW

    groups = standalone_process_groups()
    results = {}
    for mode in ("odc", "collective"):
        (chunk,) = build_chunks(ModelConfig(**MODEL), pp_rank=0, pp_size=1,
                                process_groups=groups)
        group = prim.new_group(None, config=prim.TransportConfig(
            backend="collective" if mode == "collective" else "odc"))
        engine = ShardedDataParallel(layer_units(chunk), OdcConfig(mode=mode), group)
        optimizer = ShardedAdamW(engine, AdamWConfig(lr=LR, betas=BETAS, eps=EPS,
                                                     weight_decay=WD))
        counts = []
        for step in range(STEPS):
            lengths = sample_lengths(step)
            plan = replica_plan(step, world)
            engine.begin_minibatch(max_microbatches=max(len(r) for r in plan))
            for index in plan[rank]:
                (chunk(None, make_sample(step, index, lengths[index])).sum()
                 / sum(lengths)).backward()
            engine.finish_minibatch()
            optimizer.step()
            counts.append(len(plan[rank]))
        with engine.gathered():
            params = {name: p.detach().numpy().copy()
                      for name, p in chunk.global_named_parameters()}
        results[mode] = {"params": params, "counts": counts}
        engine.destroy()
        group.destroy()
    if rank == 0:
        results["reference"] = reference(groups, world)
    return results


def reference(groups, world) -> dict:
    from odc_pp.megatron.model import ModelConfig, build_chunks

    (chunk,) = build_chunks(ModelConfig(**MODEL), pp_rank=0, pp_size=1, process_groups=groups)
    optimizer = torch.optim.AdamW(chunk.parameters(), lr=LR, betas=BETAS, eps=EPS,
                                  weight_decay=WD, foreach=False)
    for step in range(STEPS):
        lengths = sample_lengths(step)
        for replica in replica_plan(step, world):
            for index in replica:
                (chunk(None, make_sample(step, index, lengths[index])).sum()
                 / sum(lengths)).backward()
        optimizer.step()
        optimizer.zero_grad()
    return {name: p.detach().numpy().copy() for name, p in chunk.global_named_parameters()}


@pytest.mark.multiproc
def test_gpt_model_per_layer_units_dp2():
    ranks = run_workers(worker, 2, config=LaunchConfig(timeout_s=240))
    reference = ranks[0]["reference"]
    for mode in ("odc", "collective"):
        assert ranks[0][mode]["counts"] != ranks[1][mode]["counts"]
        for rank_results in ranks:
            got = rank_results[mode]["params"]
            assert got.keys() == reference.keys()
            num = sum(float(((got[k].astype("float64") - v) ** 2).sum())
                      for k, v in reference.items())
            den = sum(float((v.astype("float64") ** 2).sum()) for v in reference.values())
            assert math.sqrt(num / den) <= 1e-5, mode
