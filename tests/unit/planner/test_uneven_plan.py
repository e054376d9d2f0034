"""The planner tries lighter embedding and loss stages (Megatron's
--decoder-first/last-pipeline-num-layers): with a large vocabulary the loss stage is the
pipeline's slowest, and taking layers off it is predicted faster than equal stages."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from odc_pp.planner.hardware import PRESETS
from odc_pp.planner.inputs import ModelSpec
from odc_pp.planner.microbatch_costs import stage_times
from odc_pp.planner.search import PlanConfig, plan
from odc_pp.planner.uneven import uneven_variants


def _config() -> PlanConfig:
    model = ModelSpec(num_layers=16, hidden_size=2048, num_attention_heads=16,
                      ffn_hidden_size=5632, vocab_size=128000, seq_length=4096,
                      gated_mlp=True, num_query_groups=4)
    lengths = np.clip(np.random.default_rng(0).lognormal(np.log(1500), 1.0, 400), 16,
                      4096).astype(int)
    return PlanConfig(model=model, cluster=PRESETS["h100"], gpus=4, global_batch=32,
                      lengths=lengths, memory_gb=60.0, tp_sizes=(1,), samples=1)


def test_lighter_loss_stage_is_tried_and_predicted_faster():
    from odc_pp.training.arguments import parse_args
    from odc_pp.training.job import Job

    config = _config()
    preds, _ = plan(config)
    uneven = [p for p in preds if p.candidate.uneven is not None]
    assert uneven
    faster = 0
    for pred in uneven:
        base = next(p for p in preds if p.candidate == replace(pred.candidate, uneven=None))
        first, last = pred.candidate.uneven
        faster += last < first and pred.tokens_per_s > base.tokens_per_s
        flags = pred.flags
        assert flags[flags.index("--decoder-first-pipeline-num-layers") + 1] == str(first)
        job = Job.resolve(parse_args(flags + ["--mock-data"]), world=config.gpus)
        assert job.stage_layout.first == first and job.stage_layout.last == last
    assert faster


def test_stage_times_follow_the_layers():
    config = _config()
    preds, _ = plan(config)
    base = next(p.candidate for p in preds if p.candidate.pp == 2 and
                p.candidate.schedule == "1f1b" and p.candidate.uneven is None)
    variants = uneven_variants(config, base)
    assert [v.uneven for v in variants] == [(7, 9), (9, 7)]
    even = stage_times(config, base, 1, 2048)
    light_first = stage_times(config, variants[0], 1, 2048)
    layer = even[0][0] / 8  # stage 0: 8 layers, no logits
    assert abs(light_first[0][0] - 7 * layer) < 1e-12 * layer
    assert abs((light_first[0][1] - even[0][1]) - layer) < 1e-9 * layer
