"""The model section of the flags (``args.model``) -> the megatron chunks' ModelConfig,
and the weights they start from (seeded init, or ``--hf-checkpoint``)."""

from __future__ import annotations

from .arguments import ModelArgs
from .model_facts import hf_config_of, ties_embeddings

__all__ = ["model_config", "hf_config_of", "load_initial_weights", "ties_embeddings"]


def model_config(model: ModelArgs, *, vocab_size: int, device: str, num_stages: int):
    """ModelConfig of the flags (with ``--hf-checkpoint`` the flags hold its values,
    merged at parse time; its Llama-3 rope scaling and tied embeddings come from it).
    Tied embeddings as Megatron: tied unless ``--untie-embeddings-and-output-weights``
    (:func:`ties_embeddings`)."""
    from odc_pp.megatron.hf_config import llama3_rope_scaling, megatron_rope_scaling
    from odc_pp.megatron.model import ModelConfig

    hf = hf_config_of(model)
    if hf is not None:
        scaling = llama3_rope_scaling(hf)
    else:
        scaling = megatron_rope_scaling(model.rope_scaling_factor) \
            if model.use_rope_scaling else None
    return ModelConfig(
        vocab_size=vocab_size, hidden_size=model.hidden_size, num_layers=model.num_layers,
        num_attention_heads=model.num_attention_heads, ffn_hidden_size=model.ffn_hidden_size,
        max_sequence_length=model.max_position_embeddings,
        params_dtype=model.compute_dtype, device=device,
        recompute_lgd=model.recompute_lgd,
        recompute_method=model.recompute_method if model.recompute_full else None,
        recompute_num_layers=model.recompute_num_layers or 1, normalization=model.normalization,
        norm_epsilon=model.norm_epsilon, apply_layernorm_1p=model.apply_layernorm_1p,
        activation="swiglu" if model.swiglu else "gelu",
        num_query_groups=model.num_query_groups, kv_channels=model.kv_channels,
        position_embedding_type=model.position_embedding_type, rotary_base=model.rotary_base,
        rope_scaling=scaling, add_bias_linear=not model.disable_bias_linear,
        add_qkv_bias=model.add_qkv_bias, qk_layernorm=model.qk_layernorm,
        tie_embeddings=ties_embeddings(model), attention_backend=model.attention_backend,
        packed_attention=model.packed_attention, init_method_std=model.init_method_std,
        hidden_dropout=model.hidden_dropout, attention_dropout=model.attention_dropout,
        fused_cross_entropy=model.fused_cross_entropy, fused_swiglu=model.fused_swiglu,
        fused_rope=model.fused_rope)


def load_initial_weights(chunks, model: ModelArgs, config) -> None:
    """With ``--hf-checkpoint``: this rank's chunks take the HF weights (each rank reads
    only the tensors of its chunks). Called once, before the data-parallel engine shards
    the chunks; a checkpoint found by ``--load`` then replaces them."""
    hf = hf_config_of(model)
    if hf is None:
        return
    from odc_pp.megatron.hf import load_hf_weights

    load_hf_weights(chunks, model.hf_checkpoint, config,
                    tied_in_hf=bool(hf.get("tie_word_embeddings")))
