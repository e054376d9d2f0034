"""Context parallelism in the planner (issues 32, 33): the ring term, the memory model's
1/cp activations, and the search proposing CP (ours and the Megatron default) when the
longest samples do not fit at cp = 1."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from odc_pp.planner import context_parallel as cpm
from odc_pp.planner.hardware import PRESETS
from odc_pp.planner.inputs import ModelSpec
from odc_pp.planner.report import format_plan
from odc_pp.planner.search import PlanConfig, candidates, plan, predict
from odc_pp.training.plan_memory import rank_peaks


def _llama(seq: int) -> ModelSpec:
    return ModelSpec(num_layers=32, hidden_size=4096, num_attention_heads=32,
                     ffn_hidden_size=14336, vocab_size=128256, seq_length=seq,
                     gated_mlp=True, num_query_groups=8, kv_channels=128)


def test_ring_is_zero_at_cp1_and_grows_with_cp():
    model = _llama(2048)
    # a slow link and a short row: the transfers outlast the block compute
    ring = {cp: cpm.ring_seconds(model, rows=1, length=2048, cp=cp, tp=1,
                                 link_bytes_per_s=3.6e9, flops_per_s=4e14)
            for cp in (1, 2, 4, 8)}
    assert ring[1] == (0.0, 0.0)
    assert 0 < ring[2][0] < ring[4][0] < ring[8][0]
    assert ring[2][1] > ring[2][0]  # backward moves dK/dV too
    # NVLink inside a node, the inter-node link across nodes
    assert cpm.ring_link(PRESETS["h100"], tp=4, cp=2) == 360e9
    assert cpm.ring_link(PRESETS["h100"], tp=4, cp=4) == 40e9
    # a fast link at 128K: the block compute hides the transfers
    assert cpm.ring_seconds(_llama(131072), rows=1, length=131072, cp=2, tp=1,
                            link_bytes_per_s=360e9, flops_per_s=4e14) == (0.0, 0.0)


TINY = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
        "--ffn-hidden-size", "256", "--max-position-embeddings", "4096", "--swiglu",
        "--normalization", "RMSNorm", "--position-embedding-type", "rope",
        "--disable-bias-linear", "--vocab-size", "256", "--micro-batch-size", "1",
        "--pipeline-model-parallel-size", "1", "--pipeline-schedule", "1f1b", "--bf16"]


def test_memory_model_cp_rank_holds_a_cp1_rank_of_length_over_cp():
    """A CP rank = a cp = 1 rank with 1/cp of the tokens, its state sharded over dp x cp:
    activations halve at cp = 2, the state does not change."""
    cp2 = rank_peaks(TINY + ["--seq-length", "4096", "--global-batch-size", "2",
                             "--context-parallel-size", "2"], 2)
    cp1_half = rank_peaks(TINY + ["--seq-length", "2048", "--global-batch-size", "4"], 2)
    assert cp2 == cp1_half
    cp1 = rank_peaks(TINY + ["--seq-length", "4096", "--global-batch-size", "4"], 2)
    state = rank_peaks(TINY + ["--seq-length", "2", "--global-batch-size", "4"], 2)
    assert (cp1[0] - state[0]) == pytest.approx(2 * (cp2[0] - state[0]), rel=0.01)


def test_plan_proposes_cp_for_a_128k_tail():
    """Llama-3-8B on 2 nodes of 8 GPUs, lengths up to 128K: cp > 1 is searched and
    reaches less memory than any cp = 1 layout (tp x cp > 8: the sequence split beyond
    tp's node); with a budget between the two, the top plan and the Megatron default
    both have cp > 1."""
    rng = np.random.default_rng(0)
    lengths = np.concatenate([rng.integers(1024, 8192, 60),
                              rng.integers(98304, 131073, 40)])
    config = PlanConfig(model=_llama(131072), cluster=PRESETS["h100"], gpus=16,
                        global_batch=16, lengths=lengths, samples=1,
                        schedules=("1f1b", "zb-h1"))
    lowest = {}  # the least memory a layout reaches (with --recompute-lgd), per cp > 1
    for cand in candidates(config):
        try:
            pred = predict(config, replace(cand, recompute=True))
        except ValueError:
            continue
        key = cand.cp > 1
        lowest[key] = min(lowest.get(key, float("inf")), max(pred.peak_memory_gb))
    cp1, cps = lowest[False], lowest[True]
    assert cps < cp1  # CP divides the activations
    budget = (cp1 + cps) / 2
    preds, default = plan(replace(config, memory_gb=budget))
    assert preds[0].fits and preds[0].candidate.cp > 1
    assert not any(p.fits for p in preds if p.candidate.cp == 1)
    assert default is not None and default.fits and default.candidate.cp > 1
    assert "--context-parallel-size" in preds[0].flags
    text = format_plan(preds, default, top=3)
    assert "cp: --context-parallel-size" in text and "M: Megatron-LM as its users run it" in text


def test_baseline_takes_cp_and_micro_batch():
    from odc_pp.plan_command import baseline_candidate

    cand = baseline_candidate("--tensor-model-parallel-size 2 --context-parallel-size 2 "
                              "--micro-batch-size 2", _llama(8192), 16)
    assert (cand.tp, cand.cp, cand.pp, cand.dp, cand.micro_batch) == (2, 2, 1, 4, 2)
    with pytest.raises(ValueError, match="--context-parallel-size 4"):
        baseline_candidate("--tensor-model-parallel-size 8 --context-parallel-size 4",
                           _llama(8192), 16)
