"""The planner prices the layouts the PipeOffload and zero-bubble papers ran (issue 48,
Deliver 3): one transformer layer off the first and the last virtual stage, which is
Megatron-LM's --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split.
38 layers over 8 ranks x 5 chunks hold 0, 1 x 38, 0 layers; before, no layout of the chunk
axis split 38 layers over 8 ranks, and the flags were unknown."""

from __future__ import annotations

import numpy as np
import pytest

from odc_pp.planner.chunks import chunk_layouts
from odc_pp.planner.config import Candidate
from odc_pp.planner.hardware import PRESETS
from odc_pp.planner.inputs import ModelSpec
from odc_pp.planner.microbatch_costs import stage_times
from odc_pp.planner.search import PlanConfig, plan, predict

ACCOUNTED = ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]
BOTH = (True, True)


def model(num_layers: int) -> ModelSpec:
    return ModelSpec(num_layers=num_layers, hidden_size=256, num_attention_heads=8,
                     ffn_hidden_size=1024, vocab_size=1024, seq_length=256)


def config(num_layers: int = 38, gpus: int = 8, **changes) -> PlanConfig:
    return PlanConfig(**{**dict(model=model(num_layers), cluster=PRESETS["a100"], gpus=gpus,
                                global_batch=2 * gpus, lengths=np.array([256]),
                                tp_sizes=(1,), schedules=("interleaved", "1f1b"),
                                dp_modes=("ddp",), samples=1, token_caps=(1,),
                                memory_gb=12.0), **changes})


def five_chunk_row(ranked):
    """The fitting interleaved row of pp 8 x 5 chunks with the embedding and loss
    accounted (PipeOffload's 10.5B layout)."""
    return next(p for p in ranked if p.candidate.pp == 8 and p.candidate.num_chunks == 5
                and p.candidate.schedule == "interleaved" and p.fits)


def test_plan_prices_38_layers_at_pp8_with_five_chunks_and_both_flags():
    from odc_pp.training.arguments import parse_args
    from odc_pp.training.job import Job

    ranked, _ = plan(config())
    row = five_chunk_row(ranked)
    assert row.candidate.accounted == BOTH and row.candidate.uneven is None
    flags = row.flags
    assert flags[flags.index("--num-model-chunks") + 1] == "5"
    assert all(flag in flags for flag in ACCOUNTED)
    assert "--decoder-first-pipeline-num-layers" not in flags
    job = Job.resolve(parse_args(flags + ["--mock-data"]), world=8)
    assert job.stage_layout.counts() == (0,) + (1,) * 38 + (0,)
    # 1F1B with one layer off the first and the last stage, by the same flags
    one = next(p for p in ranked if p.candidate.pp == 8 and p.candidate.schedule == "1f1b")
    assert one.candidate.accounted == BOTH and all(flag in one.flags for flag in ACCOUNTED)


def test_the_first_and_last_virtual_stages_are_priced_lighter():
    cfg = config()
    cand = Candidate(tp=1, pp=8, dp=1, schedule="interleaved", dp_mode="ddp",
                     balance="none", packed=False, token_cap=None, chunks=5, accounted=BOTH)
    f, b, _ = stage_times(cfg, cand, 1, 256)
    assert len(f) == 40 and f[0] == 0.0 and b[0] == 0.0  # the embedding alone
    assert len({round(t, 15) for t in f[1:-1]}) == 1
    assert f[-1] < f[1]  # the logits alone, no decoder layer
    assert predict(cfg, cand).tokens_per_s > 0


@pytest.mark.parametrize("name,num_layers,pp,chunks", [
    ("interleaved", 38, 8, 5), ("interleaved", 46, 16, 3), ("1f1b", 62, 32, 1),  # PipeOffload
    ("interleaved", 22, 8, 3), ("interleaved", 30, 8, 4), ("interleaved", 46, 16, 3),
    ("interleaved", 62, 32, 2)])  # zero-bubble: one layer a chunk
def test_the_papers_layouts_are_on_the_chunk_axis(name, num_layers, pp, chunks):
    assert (chunks, None, BOTH) in chunk_layouts(name, num_layers, pp)
    cand = Candidate(tp=1, pp=pp, dp=1, schedule=name, dp_mode="ddp", balance="none",
                     packed=False, token_cap=None, chunks=chunks, accounted=BOTH)
    pred = predict(config(num_layers, pp, global_batch=2 * pp), cand)
    assert pred.tokens_per_s > 0
    assert pred.flags[-2:] == ACCOUNTED


def test_tune_offload_prices_the_10_5b_layout(capsys):
    """``odc-pp tune-offload`` at 38 layers, pp 8, 5 chunks: before, 38 did not split over
    8 x 5 and the tuner refused the count."""
    import json

    from odc_pp.planner.offload_tuner import main

    assert main(["--num-layers", "38", "--hidden-size", "256", "--num-attention-heads", "4",
                 "--seq-length", "1024", "--pp", "8", "--num-microbatches", "8",
                 "--num-model-chunks", "5", "--preset", "a100", "--json", "--top",
                 "1000"]) == 0
    rows = json.loads(capsys.readouterr().out)
    chunked = [r for r in rows if r["schedule"] in ("interleaved", "offload")]
    assert chunked and {r["num_chunks"] for r in chunked} == {5}
    for row in chunked:
        assert row["flags"][-2:] == ACCOUNTED, row["flags"]
