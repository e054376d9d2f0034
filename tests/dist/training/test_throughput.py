"""Throughput accounting: the model-FLOPs formula against torch's own FLOP counter run over
forward + backward of the real megatron-core model, and the peak-memory reading."""

import json

import pytest
import torch

from odc_pp.training.throughput import (ModelShape, default_peak_tflops, flops_per_microbatch,
                                        peak_memory_mb)
from odc_pp.testing.launch import run_workers

SHAPE = dict(vocab_size=96, hidden_size=32, num_layers=3, num_attention_heads=4,
             ffn_hidden_size=80, max_sequence_length=40)


def worker(rank, world_size, out_path):
    from torch.utils.flop_counter import FlopCounterMode

    from odc_pp.megatron.compat import singleton_process_groups
    from odc_pp.megatron.model import ModelConfig, build_chunks
    from odc_pp.data.microbatch import Microbatch

    (model,) = build_chunks(ModelConfig(**SHAPE), pp_rank=0, pp_size=1, seed=3,
                            process_groups=singleton_process_groups())
    counted = {}
    for batch, seq in [(1, 8), (2, 17), (3, 40)]:
        tokens = torch.randint(0, SHAPE["vocab_size"], (batch, seq))
        microbatch = Microbatch(tokens=tokens, labels=tokens.roll(1, 1))
        with FlopCounterMode(display=False) as counter:
            model(None, microbatch).sum().backward()
        counted[f"{batch}x{seq}"] = counter.get_total_flops()
    with open(out_path, "w") as handle:
        json.dump(counted, handle)


@pytest.mark.multiproc
def test_flops_formula_matches_torch_flop_counter(tmp_path):
    out = tmp_path / "flops.json"
    run_workers(worker, 1, str(out))
    counted = json.loads(out.read_text())
    shape = ModelShape(num_layers=SHAPE["num_layers"], hidden_size=SHAPE["hidden_size"],
                       ffn_hidden_size=SHAPE["ffn_hidden_size"], vocab_size=SHAPE["vocab_size"])
    for key, flops in counted.items():
        batch, seq = map(int, key.split("x"))
        assert flops_per_microbatch(shape, batch, seq) == pytest.approx(flops, rel=1e-9), key


def test_peak_and_memory_readings_on_cpu():
    assert default_peak_tflops(torch.device("cpu")) is None
    assert peak_memory_mb(torch.device("cpu")) > 10  # this interpreter's resident set
