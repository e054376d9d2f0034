"""A megatron-core GPT split into pipeline chunks, initialised independently of layout.

Each local chunk is its own megatron-core ``GPTModel`` holding the decoder layers of one
virtual stage (embedding on stage 0, final norm + output layer on the last stage), built
from :func:`odc_pp.megatron.spec.deferrable_gpt_layer_spec` with explicit singleton
process groups (TP=1). Every parameter is then re-initialised from a generator seeded by
``(seed, global parameter name)`` where layer indices are global, so any (pp, num_chunks,
placement, dp) gives bit-identical full models. Embeddings and output layer are untied
(tying across the first and last stage would need an extra all-reduce).
"""

from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass

import torch

from ..data.microbatch import Microbatch
from ..schedule.placement import Placement, stage_of
from .compat import (causal_mask, new_gpt_model, prepare_megatron_for_device,
                     singleton_process_groups)
from .recompute import canonical_name
from .spec import deferrable_gpt_layer_spec

__all__ = ["ModelConfig", "GPTChunk", "build_chunks", "stage_layers", "global_name"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(kw_only=True)
class ModelConfig:
    """Shape of the GPT to build."""

    vocab_size: int = 128
    """Vocabulary size (output layer rows)."""
    hidden_size: int = 64
    """Model width."""
    num_layers: int = 4
    """Decoder layers in the whole model (split over pp * num_chunks stages)."""
    num_attention_heads: int = 4
    """Attention heads; must divide hidden_size."""
    ffn_hidden_size: int | None = None
    """MLP width; None: 4 * hidden_size."""
    max_sequence_length: int = 64
    """Longest sequence (learned position embeddings)."""
    params_dtype: str = "float32"
    """Parameter dtype: float32, bfloat16 or float16."""
    init_method_std: float = 0.02
    """Std of the normal init of weights (output projections are scaled by 1/sqrt(2L))."""
    hidden_dropout: float = 0.0
    """Dropout after attention/MLP."""
    attention_dropout: float = 0.0
    """Dropout on attention probabilities."""
    device: str = "cpu"
    """Device the chunks live on."""
    recompute_lgd: bool = False
    """Recompute layernorm, GeLU and hidden-dropout outputs in backward instead of saving
    them (:mod:`odc_pp.megatron.recompute`). Same losses and gradients (bitwise on CPU),
    fewer saved bytes (:mod:`odc_pp.megatron.activation_memory`). Parameter names from
    ``global_named_parameters`` do not change."""

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} must be divisible by "
                             f"num_attention_heads {self.num_attention_heads}")
        if self.params_dtype not in _DTYPES:
            raise ValueError(f"params_dtype must be one of {sorted(_DTYPES)}, "
                             f"got {self.params_dtype!r}")
        for name in ("vocab_size", "hidden_size", "num_layers", "max_sequence_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")

    @property
    def dtype(self) -> torch.dtype:
        return _DTYPES[self.params_dtype]


def stage_layers(num_layers: int, num_stages: int, stage: int) -> range:
    """Global decoder layers of ``stage``: an even split, earlier stages take the rest."""
    if num_layers < num_stages:
        raise ValueError(f"{num_layers} layers cannot fill {num_stages} stages; "
                         "use at least one layer per stage (pp * num_chunks <= num_layers)")
    base, extra = divmod(num_layers, num_stages)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (1 if stage < extra else 0))


class GPTChunk(torch.nn.Module):
    """One virtual stage: ``forward(hidden, microbatch)`` returns the next activation
    ``[seq, batch, hidden]`` or, on the last stage, per-token losses ``[batch, seq]``."""

    def __init__(self, model: torch.nn.Module, *, stage: int, num_stages: int,
                 layers: range) -> None:
        super().__init__()
        self.model = model
        self.stage = stage
        self.num_stages = num_stages
        self.layers = layers

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.num_stages - 1

    def forward(self, hidden: torch.Tensor | None, microbatch: Microbatch) -> torch.Tensor:
        device = next(self.parameters()).device
        if self.is_first:
            tokens = microbatch.tokens.to(device)
            seq_len = tokens.shape[1]
            positions = torch.arange(seq_len, device=device).unsqueeze(0).expand_as(tokens)
        else:
            if hidden is None:
                raise ValueError(f"stage {self.stage} needs an input activation")
            tokens = positions = None
            seq_len = hidden.shape[0]
            self.model.set_input_tensor(hidden)
        output = self.model(tokens, positions, causal_mask(seq_len, device))
        if not self.is_last:
            return output
        if microbatch.labels is None:
            raise ValueError("the last stage needs microbatch.labels")
        # megatron's loss paths either read parallel_state (unfused) or torch.compile per
        # shape (fused); with TP=1 plain cross entropy on the [batch, seq, vocab] logits
        # is the same function.
        labels = microbatch.labels.to(device)
        losses = torch.nn.functional.cross_entropy(
            output.float().reshape(-1, output.shape[-1]), labels.reshape(-1),
            reduction="none")
        return losses.view_as(labels)

    def input_shape(self, microbatch: Microbatch) -> tuple[torch.Size, torch.dtype]:
        """Shape and dtype of the activation this stage receives for ``microbatch``."""
        batch, seq = microbatch.tokens.shape
        width = self.model.config.hidden_size
        return torch.Size([seq, batch, width]), self.model.config.params_dtype

    def output_shape(self, microbatch: Microbatch) -> tuple[torch.Size, torch.dtype]:
        """Shape and dtype of the activation this (non-last) stage produces."""
        return self.input_shape(microbatch)

    def global_named_parameters(self):
        """(name, param) with decoder layer indices made global and fused layernorm
        parameters (``recompute_lgd``) under their unfused names, so names, seeds and
        checkpoints do not depend on the layout or on recomputation."""
        for name, param in self.named_parameters():
            yield canonical_name(global_name(name, self.layers.start)), param


def global_name(local_name: str, first_layer: int) -> str:
    return re.sub(r"decoder\.layers\.(\d+)\.",
                  lambda match: f"decoder.layers.{int(match.group(1)) + first_layer}.",
                  local_name)


def build_chunks(config: ModelConfig, *, pp_rank: int, pp_size: int, num_chunks: int = 1,
                 placement: Placement | str = Placement.INTERLEAVED, seed: int = 1234,
                 process_groups=None) -> list[GPTChunk]:
    """This rank's model chunks (local chunk order), initialised from ``seed``.

    ``process_groups``: megatron ProcessGroupCollection with TP=CP=1 groups; default
    :func:`~odc_pp.megatron.compat.singleton_process_groups` (collective: every rank
    must call ``build_chunks`` at the same point). Needs ``torch.distributed``.
    """
    if not 0 <= pp_rank < pp_size:
        raise ValueError(f"pp_rank {pp_rank} outside 0..{pp_size - 1}")
    if num_chunks < 1:
        raise ValueError("num_chunks must be >= 1")
    placement = Placement(placement)
    prepare_megatron_for_device(config.device, seed=seed)
    groups = process_groups if process_groups is not None else singleton_process_groups()
    spec = deferrable_gpt_layer_spec(recompute_lgd=config.recompute_lgd)
    num_stages = pp_size * num_chunks
    chunks = []
    for chunk in range(num_chunks):
        stage = stage_of(placement, pp_size, pp_rank, chunk)
        layers = stage_layers(config.num_layers, num_stages, stage)
        model = new_gpt_model(_transformer_config(config, len(layers)), spec,
                              vocab_size=config.vocab_size,
                              max_sequence_length=config.max_sequence_length,
                              pre_process=stage == 0, post_process=stage == num_stages - 1,
                              process_groups=groups)
        gpt_chunk = GPTChunk(model, stage=stage, num_stages=num_stages, layers=layers)
        gpt_chunk.to(device=config.device, dtype=config.dtype)
        initialize_parameters(gpt_chunk, config, seed)
        chunks.append(gpt_chunk)
    return chunks


def _transformer_config(config: ModelConfig, num_layers: int):
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(
        num_layers=num_layers, hidden_size=config.hidden_size,
        num_attention_heads=config.num_attention_heads,
        ffn_hidden_size=config.ffn_hidden_size or 4 * config.hidden_size,
        hidden_dropout=config.hidden_dropout, attention_dropout=config.attention_dropout,
        init_method_std=config.init_method_std, params_dtype=config.dtype,
        bf16=config.dtype is torch.bfloat16, fp16=config.dtype is torch.float16,
        use_cpu_initialization=True, perform_initialization=False,
        masked_softmax_fusion=False, bias_activation_fusion=False, bias_dropout_fusion=False,
        apply_rope_fusion=False, gradient_accumulation_fusion=False, persist_layer_norm=False,
        # recompute_lgd: the MLP takes its (identity) activation from the spec and
        # linear_fc2 applies GeLU itself; no Transformer Engine is involved
        use_te_activation_func=config.recompute_lgd)


@torch.no_grad()
def initialize_parameters(chunk: GPTChunk, config: ModelConfig, seed: int) -> None:
    """Re-initialise every parameter from (seed, global name): layout independent."""
    output_std = config.init_method_std / math.sqrt(2.0 * config.num_layers)
    for name, param in chunk.global_named_parameters():
        generator = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
        if name.endswith("bias"):
            value = torch.zeros(param.shape)
        elif "norm" in name:
            value = torch.ones(param.shape)
        else:
            std = output_std if ("linear_proj" in name or "linear_fc2" in name) \
                else config.init_method_std
            value = torch.randn(param.shape, generator=generator) * std
        param.copy_(value.to(param.dtype))
