"""The Triton self-checks compile the shapes the step runs, once, at build (issue 50: the
checks used to compile other shapes, adding compiles to the first iteration). CPU: the
model hands each check its real shape; the checks themselves run on a GPU (or under
Triton's interpreter)."""

from __future__ import annotations

import importlib.util

import torch

from odc_pp.megatron import kernel_choice, model, rope_triton
from odc_pp.megatron.model_config import ModelConfig
from odc_pp.megatron.tp import TensorParallel

LLAMA3_8B = dict(vocab_size=128256, hidden_size=4096, ffn_hidden_size=14336, num_layers=2,
                 num_attention_heads=32, num_query_groups=8, max_sequence_length=64,
                 params_dtype="bfloat16", activation="swiglu", fused_swiglu="auto",
                 position_embedding_type="rope")


def test_the_swiglu_check_gets_the_models_ffn_and_dtype(monkeypatch):
    asked = []

    def use_kernel(flag, setting, device, check, shape=None):
        asked.append((flag, shape))
        return False

    monkeypatch.setattr(kernel_choice, "use_kernel", use_kernel)
    config = ModelConfig(**LLAMA3_8B)
    model._layer_spec(config, TensorParallel(), None, "p2p")
    assert asked == [("--fused-swiglu", (14336, torch.bfloat16))]


def test_the_rope_shape_is_the_models_heads_per_rank():
    config = ModelConfig(**LLAMA3_8B)
    assert model._rope_shape(config, 1) == (32, 8, 128, torch.bfloat16)
    assert model._rope_shape(config, 2) == (16, 4, 128, torch.bfloat16)


def test_use_fused_rope_hands_the_shape_to_the_check_once(monkeypatch):
    seen = []
    monkeypatch.setattr(rope_triton, "FUSED_ROPE", kernel_choice.KernelCheck(
        "RoPE", lambda device, shape: seen.append(shape)))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    shape = (32, 8, 128, torch.bfloat16)
    for _ in range(2):
        assert rope_triton.use_fused_rope("auto", "cuda:0", shape)
    assert seen == [shape]
