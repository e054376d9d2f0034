"""The planner prices what the papers ran (issue 48, Deliver 4): any number of model
chunks, and tensor-parallel collectives by latency and bandwidth.

Before, ``odc-pp plan`` and ``odc-pp tune-offload`` priced interleaved and offload at
the family's default 2 chunks only (a 5-chunk layout could not be priced, nor given to
the tuner), and a tensor-parallel collective cost its bytes over the link alone."""

from __future__ import annotations

import json

import numpy as np
import pytest

from odc_pp.planner.chunks import chunk_layouts, lighter_ends, offload_sets
from odc_pp.planner.hardware import PRESETS
from odc_pp.planner.inputs import ModelSpec
from odc_pp.planner.search import PlanConfig, plan, predict

# 70 layers split over 8 ranks x 5 chunks only with lighter ends: 5 + 6 x 10 + 5; 3.5e9
# parameters, whose state fits a 12 GB budget at pp 8 only (so the fastest are pp 8)
SEVENTY = ModelSpec(num_layers=70, hidden_size=2048, num_attention_heads=16,
                    ffn_hidden_size=8192, vocab_size=1024, seq_length=256)


def _config(**changes) -> PlanConfig:
    return PlanConfig(**{**dict(model=SEVENTY, cluster=PRESETS["a100"], gpus=8,
                                global_batch=16, lengths=np.array([256]), tp_sizes=(1,),
                                schedules=("interleaved", "offload"), dp_modes=("ddp",),
                                samples=1, token_caps=(1,), memory_gb=12.0), **changes})


def test_plan_prices_interleaved_at_five_chunks_with_uneven_stages():
    """pp 8 x 5 chunks of a 70-layer model (Megatron: the ends' layers divisible by 5, the
    middle 60 by 6 x 5): priced, and its flags carry the count and the stage sizes."""
    ranked, default = plan(_config())
    five = [p for p in ranked if p.candidate.pp == 8 and p.candidate.num_chunks == 5
            and p.candidate.schedule == "interleaved" and p.fits]
    assert five, sorted({(p.candidate.pp, p.candidate.num_chunks) for p in ranked})
    flags = five[0].flags
    assert flags[flags.index("--num-model-chunks") + 1] == "5"
    assert flags[flags.index("--decoder-first-pipeline-num-layers") + 1] == "5"
    assert flags[flags.index("--decoder-last-pipeline-num-layers") + 1] == "5"
    # row M (Megatron's ddp, interleaved) may use any virtual size too
    assert any(p.megatron_default and p.candidate.num_chunks > 2 for p in ranked)
    # and offload is priced at more than its default 2 chunks
    assert {p.candidate.num_chunks for p in ranked if p.candidate.schedule == "offload"} > {2}


def test_more_chunks_hold_more_activations_as_megatrons_warm_up_says():
    """The activation peak is the simulated schedule's, built with the candidate's chunks:
    interleaved 1F1B's warm-up on rank r holds 2 (pp - r - 1) + (v - 1) pp microbatch
    chunks before its first backward, and one more in flight."""
    from odc_pp.planner.config import Candidate
    from odc_pp.planner.search import _pipeline_link, _simulated

    model = ModelSpec(num_layers=32, hidden_size=64, num_attention_heads=4,
                      ffn_hidden_size=256, vocab_size=128, seq_length=64)
    config = _config(model=model, gpus=4, global_batch=32, lengths=np.array([64]))
    for v in (2, 4, 8):
        cand = Candidate(tp=1, pp=4, dp=1, schedule="interleaved", dp_mode="ddp",
                         balance="none", packed=False, token_cap=None, chunks=v)
        predict(config, cand)
        units = _simulated(config, cand, _pipeline_link(config, cand))[1]
        assert list(units) == [2 * (4 - r - 1) + (v - 1) * 4 + 1 for r in range(4)], v


def test_the_chunk_axis_is_bounded():
    both, neither = (True, True), (False, False)
    assert [v for v, _, _ in chunk_layouts("interleaved", 32, 4)] == [2, 4, 8]
    assert chunk_layouts("zbv", 32, 4) == [(2, None, neither)]  # a V takes 2 chunks only
    # 62 = 64 - 2: Megatron's embedding and loss accounted (7 + 8 x 6 + 7 at 2 chunks),
    # and lighter ends where they give other stages (16 + 16 + 16 + 14)
    assert chunk_layouts("interleaved", 62, 4) == [(2, None, both), (2, (16, 14), neither),
                                                   (4, None, both), (8, None, both)]
    # pp 32: 1 + 2 x 30 + 1 (the same stages as --decoder-first/last 1: priced once)
    assert chunk_layouts("offload", 62, 32) == [(1, None, both), (2, None, both)]
    # 31 = 32 - 1: the loss alone accounted (its stage also runs the logits)
    assert chunk_layouts("interleaved", 31, 8) == [(2, None, (False, True)),
                                                   (4, None, (False, True))]
    assert lighter_ends(38, 8, 5) is None  # 38 = 4 + 6 x 5 + 4: first/last not 5's
    assert len(offload_sets(3)) == 7  # every subset up to 3 chunks
    assert offload_sets(5) == [(0,), (4,), (0, 1), (3, 4), (0, 1, 2), (2, 3, 4),
                               (0, 1, 2, 3), (1, 2, 3, 4), (0, 1, 2, 3, 4)]


def test_tune_offload_takes_three_chunks(capsys):
    from odc_pp.planner.offload_tuner import main

    shape = ["--num-layers", "12", "--hidden-size", "256", "--num-attention-heads", "4",
             "--seq-length", "1024", "--pp", "2", "--num-microbatches", "4",
             "--preset", "a100", "--json", "--top", "1000"]
    assert main(shape + ["--num-model-chunks", "3"]) == 0
    rows = json.loads(capsys.readouterr().out)
    chunked = [r for r in rows if r["schedule"] in ("interleaved", "offload")]
    assert chunked and {r["num_chunks"] for r in chunked} == {3}
    assert {tuple(r["offload_chunks"]) for r in chunked if r["schedule"] == "offload"} == \
        set(offload_sets(3))
    for row in chunked:
        assert row["flags"][row["flags"].index("--num-model-chunks") + 1] == "3"
    assert main(shape + ["--num-model-chunks", "5"]) == 2  # 12 layers: not 2 x 5
    assert "--num-model-chunks 5" in capsys.readouterr().err


@pytest.mark.parametrize("preset,tp,expected_s", [
    # A100: 7 x 5 us + 7/8 x 268,435,456 B / 240 GB/s = 35 us + 978.7 us
    ("a100", 8, 7 * 5e-6 + 7 / 8 * 268435456 / 240e9),
    # H100: 3 x 0.9 us + 3/4 x 268,435,456 B / 360 GB/s
    ("h100", 4, 3 * 0.9e-6 + 3 / 4 * 268435456 / 360e9),
])
def test_a_tensor_parallel_collective_costs_latency_plus_bandwidth(preset, tp, expected_s):
    """One sequence-parallel all-gather of a 16K x 8192 bf16 activation (268 MB), and
    a layer's forward (two all-gathers, two reduce-scatters) is four of them."""
    from odc_pp.schedule.costs import tensor_parallel_comm_seconds

    hw = PRESETS[preset]
    message = 16384 * 8192 * 2
    assert hw.tp_collective_seconds(message, tp) == pytest.approx(expected_s, rel=1e-12)
    assert hw.tp_collective_seconds(message, 1) == 0.0
    f, b, w = tensor_parallel_comm_seconds(
        tokens=16384, hidden=8192, bytes_per_value=2, tp=tp,
        link_bytes_per_s=hw.tp_link_gbps * 1e9, sequence_parallel=True,
        keep_sp_input_for_w=False, latency_s=hw.tp_link_latency_us * 1e-6)
    assert (f, b, w) == pytest.approx((4 * expected_s, 4 * expected_s, 2 * expected_s))
    # a small message is latency-bound: 8 KB over 8 A100s is mostly the 7 ring steps
    small = PRESETS["a100"].tp_collective_seconds(8192, 8)
    assert small == pytest.approx(35e-6 + 7 / 8 * 8192 / 240e9) and small > 30e-6
