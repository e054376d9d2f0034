"""HF config.json <-> flags (torch-free logic): the mapping, contradiction messages, the
inverse for checkpoints trained from flags, shard sizes."""

import json

import pytest

from odc_pp.megatron.hf_config import (flags_from_hf, hf_config_from_model,
                                       llama3_rope_scaling, megatron_to_hf_names,
                                       merge_hf_flags, read_hf_config)

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


# Llama-3-8B's config.json as transformers >= 5 writes it: RoPE in one rope_parameters dict,
# no rope_theta / rope_scaling keys
LLAMA3_V5 = {key: value for key, value in LLAMA3.items()
             if key not in ("rope_theta", "rope_scaling")}
LLAMA3_V5["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 8192}
LLAMA3_SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}


def test_transformers_5_rope_parameters_give_theta_and_llama3_scaling(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_V5))
    config = read_hf_config(str(tmp_path))
    assert flags_from_hf(config)["rotary_base"] == 500000.0
    assert llama3_rope_scaling(config) == LLAMA3_SCALING == llama3_rope_scaling(LLAMA3)
    assert flags_from_hf(config) == flags_from_hf(LLAMA3)
    # a re-saved config holding both layouts, consistent; per-attention-type parameters
    both = dict(LLAMA3_V5, rope_theta=500000.0, rope_scaling=LLAMA3["rope_scaling"])
    assert llama3_rope_scaling(both) == LLAMA3_SCALING
    assert flags_from_hf(both)["rotary_base"] == 500000.0
    per_type = dict(LLAMA3_V5, rope_parameters={"full_attention": LLAMA3_V5["rope_parameters"]})
    assert llama3_rope_scaling(per_type) == LLAMA3_SCALING
    assert flags_from_hf(per_type)["rotary_base"] == 500000.0
    # Llama 2 in the new layout: no scaling, its own theta
    plain = dict(LLAMA3_V5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    assert llama3_rope_scaling(plain) is None and flags_from_hf(plain)["rotary_base"] == 10000.0


@pytest.mark.parametrize("change, message", [
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}},
     "rope_parameters rope_type 'yarn' is not supported"),
    ({"rope_theta": 10000.0}, r"conflicting RoPE bases .*rope_parameters.rope_theta"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 16.0}},
     "rope_parameters and rope_scaling disagree"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5}}, "needs 'factor'"),
    ({"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e4},
                          "sliding_attention": {"rope_type": "default", "rope_theta": 1e6}}},
     "differ between attention types")])
def test_conflicting_or_unsupported_rope_is_one_clear_error(change, message):
    with pytest.raises(ValueError, match=message) as error:
        flags_from_hf(dict(LLAMA3_V5, **change), "/models/llama3/config.json")
    assert "/models/llama3/config.json" in str(error.value)


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


def test_config_saved_by_the_installed_transformers_reads_back(tmp_path):
    """Whatever layout the installed transformers writes (rope_scaling + rope_theta before
    5, rope_parameters from 5 on), a Llama-3 config saved by it gives theta and scaling."""
    transformers = pytest.importorskip("transformers")
    import inspect

    rope = dict(LLAMA3_V5["rope_parameters"])
    shape = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    if "rope_parameters" in inspect.signature(transformers.LlamaConfig.__init__).parameters:
        config = transformers.LlamaConfig(rope_parameters=rope, **shape)
    else:
        theta = rope.pop("rope_theta")
        config = transformers.LlamaConfig(rope_theta=theta, rope_scaling=rope, **shape)
    config.save_pretrained(str(tmp_path))
    saved = read_hf_config(str(tmp_path))
    assert flags_from_hf(saved)["rotary_base"] == 500000.0, saved
    assert llama3_rope_scaling(saved) == LLAMA3_SCALING, saved
