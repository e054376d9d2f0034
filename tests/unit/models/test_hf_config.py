"""HF config.json <-> flags (torch-free logic): the mapping, contradiction messages, the
inverse for checkpoints trained from flags, shard sizes."""

import json

import pytest

from odc_pp.megatron.hf_config import (flags_from_hf, hf_config_from_model, megatron_to_hf_names,
                                       merge_hf_flags)

LLAMA3 = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
          "num_key_value_heads": 8, "num_hidden_layers": 32, "intermediate_size": 14336,
          "vocab_size": 128256, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
          "max_position_embeddings": 131072, "hidden_act": "silu",
          "tie_word_embeddings": False,
          "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}


def test_llama3_8b_flags():
    flags = flags_from_hf(LLAMA3)
    assert flags["num_query_groups"] == 8 and flags["group_query_attention"]
    assert flags["kv_channels"] is None and flags["rotary_base"] == 500000.0
    assert flags["disable_bias_linear"] and not flags["add_qkv_bias"]
    assert flags_from_hf(dict(LLAMA3, model_type="qwen2"))["add_qkv_bias"]
    assert flags_from_hf(dict(LLAMA3, model_type="qwen3", head_dim=256))["kv_channels"] == 256


@pytest.mark.parametrize("change, named", [
    ({"model_type": "gpt2"}, "model_type"), ({"hidden_act": "gelu"}, "hidden_act"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4}}, "rope_scaling")])
def test_unsupported_configs_are_named(change, named):
    with pytest.raises(ValueError, match=named):
        flags_from_hf(dict(LLAMA3, **change))


def test_merge_fills_omitted_and_names_contradictions(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3))
    from odc_pp.training.arguments import build_parser

    values = vars(build_parser().parse_args(["--mock-data", "--seq-length", "4096"]))
    merged = merge_hf_flags(values, {"mock_data", "seq_length"}, str(tmp_path))
    assert merged["num_layers"] == 32 and merged["max_position_embeddings"] == 131072
    values["hidden_size"] = 2048
    with pytest.raises(ValueError, match="--hidden-size 2048 contradicts"):
        merge_hf_flags(values, {"hidden_size"}, str(tmp_path))


def test_config_from_flags_round_trips_through_flags():
    model = dict(flags_from_hf(LLAMA3), max_position_embeddings=8192)
    config = hf_config_from_model(model)
    again = flags_from_hf(config)
    assert {k: again[k] for k in again} == {k: model[k] for k in again}
    with pytest.raises(ValueError, match="Llama-shaped"):
        hf_config_from_model({"normalization": "LayerNorm"})


def test_names():
    assert megatron_to_hf_names("model.decoder.layers.7.mlp.linear_fc1.weight") == (
        "model.layers.7.mlp.gate_proj.weight", "model.layers.7.mlp.up_proj.weight")
    assert megatron_to_hf_names("model.output_layer.weight", tied_in_hf=True) == (
        "model.embed_tokens.weight",)
    with pytest.raises(ValueError, match="no Hugging Face counterpart"):
        megatron_to_hf_names("model.embedding.position_embeddings.weight")
