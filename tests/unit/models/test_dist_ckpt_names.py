"""Megatron checkpoint keys -> our global parameter names (odc_pp.megatron.dist_ckpt): stacked
decoder layers split per layer, Transformer Engine's fused norm names unfused, optimizer
state per parameter recognised, byte entries and unknown states left out."""

import pytest
import torch

from odc_pp.megatron.dist_ckpt import odc_names, odc_state_from_megatron


def test_keys_map_to_global_names():
    assert odc_names("embedding.word_embeddings.weight", 2) == \
        ["model.embedding.word_embeddings.weight"]
    assert odc_names("decoder.layers.self_attention.linear_qkv.layer_norm_weight", 2) == \
        ["model.decoder.layers.0.input_layernorm.weight",
         "model.decoder.layers.1.input_layernorm.weight"]
    assert odc_names("decoder.layers.3.mlp.linear_fc1.layer_norm_bias", 8) == \
        ["model.decoder.layers.3.pre_mlp_layernorm.bias"]
    assert odc_names("decoder.layers.mlp.linear_fc1._extra_state/shard_0_2", 2) is None
    assert odc_names("optimizer.state.exp_avg.output_layer.weight", 2) is None


def test_state_splits_layers_and_reads_per_parameter_optimizer_state():
    stacked = torch.arange(2 * 3 * 4, dtype=torch.float32).view(2, 3, 4)
    tensors = {"decoder.layers.self_attention.linear_proj.weight": stacked,
               "output_layer.weight": torch.ones(5, 4),
               "optimizer.state.exp_avg.decoder.layers.self_attention.linear_proj.weight":
                   stacked * 2,
               "optimizer.state.fp32_param.output_layer.weight": torch.full((5, 4), 3.0),
               "optimizer.state.step_buffer.output_layer.weight": torch.zeros(5, 4)}
    weights, optimizer = odc_state_from_megatron(tensors, num_layers=2)
    assert sorted(weights) == ["model.decoder.layers.0.self_attention.linear_proj.weight",
                               "model.decoder.layers.1.self_attention.linear_proj.weight",
                               "model.output_layer.weight"]
    assert torch.equal(weights["model.decoder.layers.1.self_attention.linear_proj.weight"],
                       stacked[1])
    assert sorted(optimizer) == ["exp_avg", "master"]
    assert torch.equal(optimizer["exp_avg"][
        "model.decoder.layers.0.self_attention.linear_proj.weight"], stacked[0] * 2)
    assert float(optimizer["master"]["model.output_layer.weight"][0, 0]) == 3.0


def test_a_stack_of_another_depth_names_the_flag():
    with pytest.raises(ValueError, match="stacks 2 layers; the model has 4"):
        odc_state_from_megatron({"decoder.layers.mlp.linear_fc2.weight": torch.zeros(2, 3)},
                                num_layers=4)
