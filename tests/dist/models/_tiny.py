"""Tiny random Hugging Face models made locally with save_pretrained (no download)."""

from __future__ import annotations

import torch

ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral")


def hf_config(kind: str, *, num_layers: int = 4, tie: bool | None = None,
              vocab_size: int = 96):
    import transformers

    common = dict(vocab_size=vocab_size, hidden_size=32, intermediate_size=48,
                  num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=64, rms_norm_eps=1e-6, torch_dtype="float32")
    if kind == "llama":
        config = transformers.LlamaConfig(
            rope_theta=500000.0, tie_word_embeddings=bool(tie),
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
            **common)
    elif kind == "qwen2":
        config = transformers.Qwen2Config(rope_theta=1000000.0,
                                          tie_word_embeddings=True if tie is None else tie,
                                          use_sliding_window=False, **common)
    elif kind == "qwen3":
        config = transformers.Qwen3Config(rope_theta=1000000.0, head_dim=16,
                                          tie_word_embeddings=True if tie is None else tie,
                                          use_sliding_window=False, **common)
    elif kind == "mistral":
        config = transformers.MistralConfig(rope_theta=10000.0, sliding_window=None,
                                            tie_word_embeddings=bool(tie), **common)
    else:
        raise ValueError(kind)
    config._attn_implementation = "eager"
    return config


def make_hf_model(kind: str, directory: str, *, seed: int = 0, max_shard_size=None,
                  **kwargs):
    """A random tiny model (every weight, norms and biases included, perturbed so a wrong
    mapping shows) saved as safetensors into ``directory``; returns the model (fp32)."""
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(hf_config(kind, **kwargs),
                                                          attn_implementation="eager")
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            else:
                param.copy_(0.2 * torch.randn_like(param))
    model.eval()
    extra = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(directory, safe_serialization=True, **extra)
    return model

