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
LLAMA = dict(SHAPE, activation="swiglu", num_query_groups=2, kv_channels=12,
             position_embedding_type="rope", normalization="RMSNorm", add_bias_linear=False)
"""SwiGLU, GQA (4 heads over 2 groups) and a head dimension other than h / a: Megatron's
formula counts 3 h f for the MLP and g/a of the query width for K and V."""


def worker(rank, world_size, out_path, config=SHAPE):
    from torch.utils.flop_counter import FlopCounterMode

    from odc_pp.training.distributed import standalone_process_groups
    from odc_pp.megatron.model import ModelConfig, build_chunks
    from odc_pp.data.microbatch import Microbatch

    (model,) = build_chunks(ModelConfig(**config), pp_rank=0, pp_size=1, seed=3,
                            process_groups=standalone_process_groups())
    counted = {}
    for batch, seq in [(1, 8), (2, 17), (3, 40)]:
        tokens = torch.randint(0, SHAPE["vocab_size"], (batch, seq))
        microbatch = Microbatch(tokens=tokens, labels=tokens.roll(1, 1))
        with FlopCounterMode(display=False) as counter:
            model(None, microbatch).sum().backward()
        counted[f"{batch}x{seq}"] = counter.get_total_flops()
    with open(out_path, "w") as handle:
        json.dump(counted, handle)


def _shape(config: dict) -> ModelShape:
    return ModelShape(num_layers=config["num_layers"], hidden_size=config["hidden_size"],
                      ffn_hidden_size=config["ffn_hidden_size"], vocab_size=config["vocab_size"],
                      num_attention_heads=config["num_attention_heads"],
                      num_query_groups=config.get("num_query_groups"),
                      kv_channels=config.get("kv_channels"),
                      gated_mlp=config.get("activation") == "swiglu")


@pytest.mark.multiproc
@pytest.mark.parametrize("config", [SHAPE, LLAMA], ids=["gpt", "swiglu-gqa"])
def test_flops_formula_matches_torch_flop_counter(tmp_path, config):
    out = tmp_path / "flops.json"
    run_workers(worker, 1, str(out), config)
    counted = json.loads(out.read_text())
    shape = _shape(config)
    for key, flops in counted.items():
        batch, seq = map(int, key.split("x"))
        assert flops_per_microbatch(shape, batch, seq) == pytest.approx(flops, rel=1e-9), key


def test_peak_and_memory_readings_on_cpu():
    assert default_peak_tflops(torch.device("cpu")) is None
    assert peak_memory_mb(torch.device("cpu")) > 10  # this interpreter's resident set


def test_model_shape_of_the_flags_is_megatrons_formula():
    """ModelShape.of(--flags) for Llama-3-8B's layer shape gives Megatron-LM's
    12 B s L h^2 ((1 + g/a + s/h) + 1.5 f/h + V / (2 L h)) (the issue's 6.55e14 per step
    of 8 x 8192 tokens at 4 layers)."""
    from types import SimpleNamespace
    model = SimpleNamespace(num_layers=4, hidden_size=4096, ffn_hidden_size=14336,
                            num_attention_heads=32, num_query_groups=8, kv_channels=None,
                            group_query_attention=True, swiglu=True)
    shape = ModelShape.of(model, 128256)
    b, s, L, h, a, g, f, V = 8, 8192, 4, 4096, 32, 8, 14336, 128256
    megatron = 12 * b * s * L * h * h * ((1 + g / a + s / h) + 1.5 * f / h + V / (2 * L * h))
    assert flops_per_microbatch(shape, b, s) == pytest.approx(megatron, rel=1e-12)
    assert megatron == pytest.approx(6.55e14, rel=2e-3)
