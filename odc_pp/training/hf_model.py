"""The model to plan from a Hugging Face ``config.json``: the loader of ``odc-pp plan
--hf-config`` and ``odc-pp tune-offload --hf-config`` (training level: it reads the config
with :mod:`odc_pp.megatron.hf_config`, the mapping ``--hf-checkpoint`` trains with)."""

from __future__ import annotations

import os

from odc_pp.planner.inputs import ModelSpec

__all__ = ["model_from_hf"]


def model_from_hf(path: str, *, seq_length: int | None = None) -> ModelSpec:
    """From an HF ``config.json`` (the file or its directory); a ValueError naming
    ``--hf-config`` when there is none."""
    from odc_pp.megatron.hf_config import flags_from_hf, read_hf_config

    directory = os.path.dirname(path) if path.endswith(".json") else path
    if not os.path.isfile(os.path.join(directory or ".", "config.json")):
        raise ValueError(f"--hf-config {path}: no config.json there (give a Hugging Face "
                         f"model directory or its config.json)")
    config = read_hf_config(directory)
    flags = flags_from_hf(config, os.path.join(directory, "config.json"))
    seq = seq_length or int(config.get("max_position_embeddings", 4096))
    return ModelSpec(num_layers=flags["num_layers"], hidden_size=flags["hidden_size"],
                     num_attention_heads=flags["num_attention_heads"],
                     ffn_hidden_size=flags["ffn_hidden_size"], vocab_size=flags["vocab_size"],
                     seq_length=seq, gated_mlp=flags["swiglu"],
                     num_query_groups=flags["num_query_groups"],
                     kv_channels=flags["kv_channels"],
                     tied=bool(config.get("tie_word_embeddings", False)),
                     normalization=flags["normalization"],
                     position_embedding_type=flags["position_embedding_type"],
                     source_flags=("--hf-checkpoint", directory, "--seq-length", str(seq)))
