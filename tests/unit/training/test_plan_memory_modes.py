"""The memory model's peak follows ``--dp-mode``: Megatron's ``ddp`` keeps parameters
replicated, ODC shards them, so the two are different jobs (issue 49: where ODC's gain
over ``ddp`` is memory)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from odc_pp.training.plan_memory import rank_peaks

SHAPE = ("--num-layers 4 --hidden-size 512 --num-attention-heads 8 --ffn-hidden-size 2048 "
         "--vocab-size 32000 --seq-length 1024 --max-position-embeddings 1024 --bf16 "
         "--micro-batch-size 1 --global-batch-size 32 --lr 1e-4 --train-iters 2 "
         "--load-balance balanced").split()


def test_ddp_and_odc_peaks_are_computed_apart_not_cached_as_one():
    odc_minibatch = rank_peaks(SHAPE + ["--dp-mode", "odc"], 8)  # auto, no budget: minibatch
    odc_layer = rank_peaks(SHAPE + "--dp-mode odc --odc-param-residency layer".split(), 8)
    ddp = rank_peaks(SHAPE + ["--dp-mode", "ddp"], 8)
    # ddp: parameters replicated (no shard beside them), no fp32 accumulator beside main_grad
    assert ddp[0] < odc_minibatch[0]
    # ODC gathering per layer holds less than ddp's replicated parameters
    assert odc_layer[0] < ddp[0]


def test_bench_ddp_memory_reports_the_largest_model_each_mode_fits():
    path = Path(__file__).parents[3] / "benchmarks" / "bench_ddp_memory.py"
    spec = importlib.util.spec_from_file_location("bench_ddp_memory", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = [{"layout": layout, "model": model, "odc_fits": i < 2, "ddp_fits": i < 1}
            for layout in bench.LAYOUTS for i, model in enumerate(bench.MODELS)]
    first, second = list(bench.MODELS)[:2]
    assert set(bench.largest(rows, "ddp").values()) == {first}
    assert set(bench.largest(rows, "odc").values()) == {second}
