"""Hugging Face ``config.json`` <-> odc-pp model flags, and HF <-> megatron parameter names
(torch-free: the argument parser imports it).

Supported ``model_type``: ``llama`` (Llama 2 / 3, with Llama-3 RoPE scaling, read from
``rope_parameters`` as transformers >= 5 writes it or from ``rope_scaling`` / ``rope_theta``),
``mistral``, ``qwen2`` (Qwen2 / Qwen2.5: qkv bias) and ``qwen3`` (q/k RMSNorm). All are
pre-norm decoders with RMSNorm, SwiGLU, grouped-query attention and rotary embeddings.

* :func:`flags_from_hf` -> ``{flag field: value}`` of ``args.model`` (``--num-layers``,
  ``--normalization``, ...); :func:`merge_hf_flags` fills the flags a user omitted and
  names the first one that contradicts the config.
* :func:`hf_config_from_model` is the inverse, for checkpoints trained from flags alone.
* :func:`megatron_to_hf_names`: the HF tensors one megatron parameter (global name, see
  :mod:`odc_pp.megatron.model`) is made of; the tensor conversion is in
  :mod:`odc_pp.megatron.hf`.
"""

from __future__ import annotations

import json
import os
import re

__all__ = ["SUPPORTED_MODEL_TYPES", "read_hf_config", "flags_from_hf", "merge_hf_flags",
           "hf_config_from_model", "megatron_to_hf_names", "given_flags", "rope_theta",
           "llama3_rope_scaling", "MEGATRON_ROPE_SCALING", "megatron_rope_scaling"]

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")

# flag fields that --hf-checkpoint determines (all in args.model)
_HF_FLAGS = ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size",
             "vocab_size", "normalization", "norm_epsilon", "swiglu",
             "group_query_attention", "num_query_groups", "kv_channels",
             "position_embedding_type", "rotary_base", "disable_bias_linear", "add_qkv_bias",
             "qk_layernorm")


def read_hf_config(directory: str) -> dict:
    """The ``config.json`` of a local HF model directory (errors name the file)."""
    path = os.path.join(directory, "config.json")
    if not os.path.isfile(path):
        raise ValueError(f"--hf-checkpoint {directory}: no config.json (give a local Hugging "
                         f"Face model directory)")
    try:
        with open(path) as handle:
            config = json.load(handle)
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: unreadable ({exc})") from exc
    if not isinstance(config, dict):
        raise ValueError(f"{path}: not a JSON object")
    return config


def _get(config: dict, key: str, path: str):
    if key not in config:
        raise ValueError(f"{path}: config.json lacks {key!r}")
    return config[key]


def _rope_sources(config: dict, path: str) -> list[tuple[str, dict]]:
    """The RoPE dicts a config holds, named by key: transformers >= 5 writes
    ``rope_parameters`` (``rope_type``, ``rope_theta`` and the scaling fields in one dict;
    per attention type in models that mix them), earlier versions ``rope_scaling`` and a
    top-level ``rope_theta``. Both may be present (a re-saved config)."""
    sources = []
    parameters = config.get("rope_parameters")
    if parameters:
        if not isinstance(parameters, dict):
            raise ValueError(f"{path}: rope_parameters must be an object, got "
                             f"{parameters!r}")
        nested = {key: value for key, value in parameters.items() if isinstance(value, dict)}
        if nested:  # per layer type ({"full_attention": {...}, ...})
            distinct = {json.dumps(value, sort_keys=True) for value in nested.values()}
            if len(distinct) > 1:
                raise ValueError(f"{path}: rope_parameters differ between attention types "
                                 f"{sorted(nested)}; odc-pp applies one RoPE to every layer")
            parameters = next(iter(nested.values()))
        sources.append(("rope_parameters", parameters))
    if config.get("rope_scaling"):
        if not isinstance(config["rope_scaling"], dict):
            raise ValueError(f"{path}: rope_scaling must be an object, got "
                             f"{config['rope_scaling']!r}")
        sources.append(("rope_scaling", config["rope_scaling"]))
    return sources


def rope_theta(config: dict, path: str = "config.json") -> float:
    """The RoPE base: ``rope_parameters.rope_theta`` (transformers >= 5) or the top-level
    ``rope_theta``; 10000 when neither is given; a ValueError naming both when they
    disagree."""
    values = {}
    for key, source in _rope_sources(config, path):
        if "rope_theta" in source:
            values[f"{key}.rope_theta"] = float(source["rope_theta"])
    if "rope_theta" in config:
        values["rope_theta"] = float(config["rope_theta"])
    if len(set(values.values())) > 1:
        raise ValueError(f"{path}: conflicting RoPE bases {values}; keep one")
    return next(iter(values.values()), 10000.0)


def _llama3_fields(scaling: dict) -> dict:
    return {"factor": float(scaling["factor"]),
            "low_freq_factor": float(scaling.get("low_freq_factor", 1.0)),
            "high_freq_factor": float(scaling.get("high_freq_factor", 4.0)),
            "original_max_position_embeddings":
                int(scaling.get("original_max_position_embeddings", 8192))}


MEGATRON_ROPE_SCALING = {"low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192}
"""What Megatron-LM's ``--use-rope-scaling`` fixes (only ``--rope-scaling-factor`` is a
flag): megatron-core's ``RotaryEmbedding._apply_scaling`` defaults."""


def megatron_rope_scaling(factor: float) -> dict:
    """The Llama-3 scaling Megatron-LM's ``--use-rope-scaling --rope-scaling-factor
    factor`` builds (the other three fields fixed: :data:`MEGATRON_ROPE_SCALING`)."""
    return {"factor": float(factor), **MEGATRON_ROPE_SCALING}


def llama3_rope_scaling(config: dict, path: str = "config.json") -> dict | None:
    """The Llama-3 RoPE scaling parameters (from ``rope_parameters`` of transformers >= 5
    or the older ``rope_scaling``), None without scaling. Another ``rope_type``, a Llama-3
    type without ``factor``, or the two keys disagreeing is one ValueError naming the
    file and the key."""
    found = {}
    for key, source in _rope_sources(config, path):
        kind = source.get("rope_type", source.get("type", "default"))
        if kind == "default":
            found[key] = None
            continue
        if kind != "llama3":
            raise ValueError(f"{path}: {key} rope_type {kind!r} is not supported (only "
                             f"'llama3' scaling or 'default')")
        if "factor" not in source:
            raise ValueError(f"{path}: {key} rope_type 'llama3' needs 'factor'")
        found[key] = _llama3_fields(source)
    if len({json.dumps(value, sort_keys=True) for value in found.values()}) > 1:
        raise ValueError(f"{path}: rope_parameters and rope_scaling disagree ({found}); "
                         f"keep one (transformers >= 5 reads rope_parameters)")
    return next(iter(found.values()), None)


def flags_from_hf(config: dict, path: str = "config.json") -> dict:
    """``{args.model field: value}`` that an HF config determines. Raises ValueError
    naming the file and field for an unsupported model."""
    kind = config.get("model_type")
    if kind not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"{path}: model_type {kind!r} is not supported (supported: "
                         f"{', '.join(SUPPORTED_MODEL_TYPES)})")
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"{path}: hidden_act {act!r} is not supported (only 'silu': SwiGLU)")
    if config.get("mlp_bias"):
        raise ValueError(f"{path}: mlp_bias true is not supported")
    llama3_rope_scaling(config, path)
    theta = rope_theta(config, path)
    hidden = int(_get(config, "hidden_size", path))
    heads = int(_get(config, "num_attention_heads", path))
    groups = int(config.get("num_key_value_heads") or heads)
    head_dim = config.get("head_dim")
    qkv_bias = kind == "qwen2" or bool(config.get("attention_bias", False))
    return {
        "num_layers": int(_get(config, "num_hidden_layers", path)),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "ffn_hidden_size": int(_get(config, "intermediate_size", path)),
        "vocab_size": int(_get(config, "vocab_size", path)),
        "normalization": "RMSNorm",
        "norm_epsilon": float(config.get("rms_norm_eps", 1e-6)),
        "swiglu": True,
        "group_query_attention": groups != heads,
        "num_query_groups": groups if groups != heads else None,
        "kv_channels": int(head_dim) if head_dim and int(head_dim) * heads != hidden
        else None,
        "position_embedding_type": "rope",
        "rotary_base": theta,
        "disable_bias_linear": True,
        "add_qkv_bias": qkv_bias,
        "qk_layernorm": kind == "qwen3",
    }


def given_flags(argv: list[str]) -> set[str]:
    """Flag fields written on the command line (``--num-layers 4`` -> ``num_layers``)."""
    return {token[2:].partition("=")[0].replace("-", "_")
            for token in argv if token.startswith("--")}


def merge_hf_flags(values: dict, given: set[str], directory: str) -> dict:
    """Flag values with those ``--hf-checkpoint`` determines filled in; ValueError naming
    the first given flag that contradicts the config (and the config field)."""
    path = os.path.join(directory, "config.json")
    config = read_hf_config(directory)
    derived = flags_from_hf(config, path)
    merged = dict(values)
    for name in _HF_FLAGS:
        want = derived[name]
        if name in given and values.get(name) != want:
            if name in ("num_query_groups", "kv_channels") and want is None:
                # None means "the same as the heads / hidden / heads": accept that value
                same = (values[name] == (derived["num_attention_heads"]
                                         if name == "num_query_groups" else
                                         derived["hidden_size"] // derived["num_attention_heads"]))
                if same:
                    continue
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} {values.get(name)} contradicts --hf-checkpoint "
                             f"{path} (which gives {want}); drop {flag} or fix it")
        merged[name] = want if name not in given else values[name]
    if "max_position_embeddings" not in given:
        merged["max_position_embeddings"] = max(
            int(config.get("max_position_embeddings", values["seq_length"])),
            values["seq_length"])
    for name in ("hidden_dropout", "attention_dropout"):  # HF configs: 0.0 (Llama, Qwen)
        if name not in given:
            merged[name] = float(config.get(name, 0.0) or 0.0)
    sliding = config.get("sliding_window")
    uses_sliding = config.get("use_sliding_window", config.get("model_type") == "mistral")
    if sliding and uses_sliding and int(sliding) < values["seq_length"]:
        raise ValueError(f"--seq-length {values['seq_length']} exceeds the sliding window "
                         f"{sliding} of {path}; sliding-window attention is not supported: "
                         f"use --seq-length <= {sliding}")
    return merged


def hf_config_from_model(model: dict) -> dict:
    """An HF ``config.json`` for a model described by odc-pp's model keys (a checkpoint's
    meta: ``num_layers``, ``hidden_size``, ... ``normalization``, ``swiglu``, ...).
    Llama-shaped models only (RMSNorm, SwiGLU, RoPE, no linear biases)."""
    if model.get("normalization") != "RMSNorm" or not model.get("swiglu") or \
            model.get("position_embedding_type") != "rope" or \
            not model.get("disable_bias_linear"):
        raise ValueError("only Llama-shaped models (--normalization RMSNorm --swiglu "
                         "--position-embedding-type rope --disable-bias-linear) export to "
                         "Hugging Face; this checkpoint is a GPT")
    kind = "qwen3" if model.get("qk_layernorm") else "qwen2" if model.get("add_qkv_bias") \
        else "llama"
    heads = model["num_attention_heads"]
    head_dim = model.get("kv_channels") or model["hidden_size"] // heads
    architectures = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                     "qwen3": "Qwen3ForCausalLM"}
    config = {"architectures": [architectures[kind]], "model_type": kind,
              "vocab_size": model["vocab_size"], "hidden_size": model["hidden_size"],
              "intermediate_size": model["ffn_hidden_size"],
              "num_hidden_layers": model["num_layers"], "num_attention_heads": heads,
              "num_key_value_heads": model.get("num_query_groups") or heads,
              "head_dim": head_dim, "hidden_act": "silu",
              "max_position_embeddings": model["max_position_embeddings"],
              "rms_norm_eps": model.get("norm_epsilon", 1e-5),
              "rope_theta": model.get("rotary_base", 10000.0),
              "tie_word_embeddings": False, "torch_dtype": "float32"}
    if kind == "llama":
        config["attention_bias"] = False
        config["mlp_bias"] = False
    return config


_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_LAYER_MAP = {
    "input_layernorm.weight": ("input_layernorm.weight",),
    "pre_mlp_layernorm.weight": ("post_attention_layernorm.weight",),
    "self_attention.linear_qkv.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                         "self_attn.v_proj.weight"),
    "self_attention.linear_qkv.bias": ("self_attn.q_proj.bias", "self_attn.k_proj.bias",
                                       "self_attn.v_proj.bias"),
    "self_attention.linear_proj.weight": ("self_attn.o_proj.weight",),
    "self_attention.q_layernorm.weight": ("self_attn.q_norm.weight",),
    "self_attention.k_layernorm.weight": ("self_attn.k_norm.weight",),
    "mlp.linear_fc1.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
    "mlp.linear_fc2.weight": ("mlp.down_proj.weight",),
}


def megatron_to_hf_names(name: str, *, tied_in_hf: bool = False) -> tuple[str, ...]:
    """HF tensor names one megatron parameter (canonical global name) is built from.
    ``tied_in_hf``: the HF model ties ``lm_head`` to the embedding (no ``lm_head`` tensor)."""
    name = name.removeprefix("model.")
    if name == "embedding.word_embeddings.weight":
        return ("model.embed_tokens.weight",)
    if name == "output_layer.weight":
        return ("model.embed_tokens.weight",) if tied_in_hf else ("lm_head.weight",)
    if name == "decoder.final_layernorm.weight":
        return ("model.norm.weight",)
    match = _LAYER.match(name)
    if match and match.group(2) in _LAYER_MAP:
        prefix = f"model.layers.{match.group(1)}."
        return tuple(prefix + part for part in _LAYER_MAP[match.group(2)])
    raise ValueError(f"parameter {name!r} has no Hugging Face counterpart")
