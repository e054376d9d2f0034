"""A megatron-core GPT split into pipeline chunks, initialised independently of layout.

Each local chunk is its own megatron-core ``GPTModel`` holding the decoder layers of one
virtual stage (embedding on stage 0, final norm + output layer on the last stage), built
from :func:`odc_pp.megatron.spec.deferrable_gpt_layer_spec` with explicit singleton
process groups (TP=1). Every parameter is then re-initialised from a generator seeded by
``(seed, global parameter name)`` where layer indices are global, so any (pp, num_chunks,
placement, dp) gives bit-identical full models -- or loaded from a Hugging Face checkpoint
(:mod:`odc_pp.megatron.hf`).

Architectures (:class:`ModelConfig`): GPT (LayerNorm, GeLU, learned positions) and the
Llama family -- RMSNorm, SwiGLU, grouped-query attention, rotary embeddings with
``rotary_base`` and Llama-3 scaling, optional qkv bias (Qwen2) and q/k RMSNorm (Qwen3).
Tied embeddings (``tie_embeddings``). When one chunk holds both, megatron's ``GPTModel``
shares the weight. Across stages (Megatron's way) the last stage's output layer holds its
own copy, initialised (and loaded) from the embedding's name so both start equal and
marked ``shared_embedding``; :func:`tied_embedding_params` names the two copies, and
the data-parallel engine sums their gradients before every step
(:meth:`odc_pp.odc.engine.ShardedDataParallel.tie`), so they stay equal.

Packing: a microbatch's ``position_ids`` feed the learned or rotary positions and its
``segment_ids`` the attention: the SDPA core attention gets them as
:class:`~odc_pp.megatron.packed_attention.PackedSegments` (varlen / FlexAttention, no
``s x s`` mask; ``packed_attention`` picks the kernel), the host attention as the dense
mask of :func:`~odc_pp.megatron.compat.packed_causal_mask`.
"""

from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..data.microbatch import Microbatch
from ..data.pinned import to_device
from ..schedule.placement import Placement, stage_of
from ..schedule.stage_layout import StageLayout
from .compat import (causal_mask, gpt_chunk_forward, new_gpt_model, packed_causal_mask,
                     prepare_megatron_for_device, rope_fusion_available, rope_inv_freq,
                     rotary_embedding, deferrable_output_layer)
from .dropout import microbatch_scope, use_keyed_embedding_dropout
from .full_recompute import apply_full_recompute
from .rope_triton import RotaryInAttention, use_fused_rope
from .swiglu import use_fused_swiglu
from .embedding_grad import use_main_grad_lookup
from .linear_cross_entropy import (linear_cross_entropy, use_fused_cross_entropy,
                                   warm_cross_entropy)
from .model_config import ModelConfig
from .packed_attention import PackedSegments, short_row_segments
from .context_parallel import LocalRows
from .recompute import canonical_name
from .spec import deferrable_gpt_layer_spec
from .tp import TensorParallel, reduce_partial_grads, vocab_parallel_cross_entropy
from .tp_layout import partition_of

__all__ = ["ModelConfig", "GPTChunk", "build_chunks", "stage_layers", "stage_layout",
           "global_name", "tied_embedding_params", "EMBEDDING_WEIGHT", "OUTPUT_WEIGHT"]

EMBEDDING_WEIGHT = "model.embedding.word_embeddings.weight"
"""Canonical global name of the input embedding."""
OUTPUT_WEIGHT = "model.output_layer.weight"
"""Canonical global name of the output layer (a copy of the embedding when tied across
stages)."""

def _same_rows(positions: torch.Tensor | None) -> bool:
    """Whether every row of a microbatch has the same positions, from its host copy (no
    device synchronisation inside F): None means 0..s-1 in every row."""
    if positions is None or positions.shape[0] == 1:
        return True
    return bool((positions == positions[:1]).all())  # the runtime keeps microbatches on CPU


def stage_layers(num_layers: int, num_stages: int, stage: int) -> range:
    """Global decoder layers of ``stage`` of an even split (earlier stages take the rest);
    uneven stages: :class:`~odc_pp.schedule.stage_layout.StageLayout`."""
    return StageLayout.even(num_layers, num_stages).layers(stage)


def stage_layout(config: ModelConfig, pp_size: int, num_chunks: int) -> StageLayout:
    """The layer layout of ``config`` over ``pp_size`` ranks of ``num_chunks`` chunks."""
    return StageLayout.resolve(config.num_layers, pp_size, num_chunks,
                               first=config.num_layers_in_first_pipeline_stage,
                               last=config.num_layers_in_last_pipeline_stage,
                               account_embedding=config.account_for_embedding_in_pipeline_split,
                               account_loss=config.account_for_loss_in_pipeline_split)


class GPTChunk(torch.nn.Module):
    """One virtual stage: ``forward(hidden, microbatch)`` returns the next activation
    ``[seq, batch, hidden]`` or, on the last stage, per-token losses ``[batch, seq]``."""

    def __init__(self, model: torch.nn.Module, *, stage: int, num_stages: int,
                 layers: range, inv_freq: torch.Tensor | None = None,
                 implicit_causal: bool = False, packed_kernel: str = "auto",
                 tensor_parallel: TensorParallel | None = None) -> None:
        super().__init__()
        self.model = model
        self.tensor_parallel = tensor_parallel or TensorParallel()
        """Tensor-parallel group and sequence-parallel setting (default: tp = 1)."""
        self.gated_mlp = model.config.gated_linear_unit
        """SwiGLU: ``linear_fc1`` holds [gate; up] (split as *gated*, tp_layout)."""
        self.stage = stage
        self.num_stages = num_stages
        self.layers = layers
        self.inv_freq = inv_freq
        """RoPE inverse frequencies (fp32, a plain attribute so dtype casts leave it);
        None: learned absolute positions."""
        self.implicit_causal = implicit_causal
        """The core attention is causal without a mask (SDPA): unpacked microbatches pass
        no mask; packed ones pass :class:`PackedSegments`."""
        self.packed_kernel = packed_kernel
        """Requested packed-attention kernel (``ModelConfig.packed_attention``)."""
        self.context_parallel = False
        """The microbatches hold this rank's part of a context-parallel sequence: the
        core attention is causal over the CP group, masked per document by
        ``microbatch.full_segment_ids`` (packed rows) when the microbatch has them."""
        self.tied_across_stages = False
        """The model ties embedding and output layer on different stages (two copies kept
        equal: :func:`tied_embedding_params`)."""
        self.full_length: int | None = None
        """Rows of this many tokens keep ``is_causal`` SDPA; shorter unpacked rows go
        through the varlen kernel where it runs (:func:`~odc_pp.megatron.packed_attention.
        short_row_segments`). None: always ``is_causal``."""
        self.dropout_seed = 0
        """Seed of the keyed dropout masks (the model's init seed)."""
        self.fused_cross_entropy = False
        """The last stage applies its output layer inside the loss, chunk by chunk
        (:func:`~odc_pp.megatron.linear_cross_entropy.linear_cross_entropy`)."""

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.num_stages - 1

    def forward(self, hidden: torch.Tensor | None, microbatch: Microbatch) -> torch.Tensor:
        fused = self.is_last and self.fused_cross_entropy
        output = self.logits_or_hidden(hidden, microbatch, output_layer=not fused)
        if not self.is_last:
            return output
        if microbatch.labels is None:
            raise ValueError("the last stage needs microbatch.labels")
        if fused:
            return linear_cross_entropy(output, self.output_weight(),
                                        to_device(microbatch.labels, output.device),
                                        microbatch.loss_mask)
        # megatron's loss paths either read parallel_state (unfused) or torch.compile per
        # shape (fused); with TP=1 plain cross entropy on the [batch, seq, vocab] logits
        # is the same function.
        labels = to_device(microbatch.labels, output.device)
        if self.tensor_parallel.size > 1:
            return vocab_parallel_cross_entropy(output.float(), labels,
                                                self.tensor_parallel.group)
        losses = torch.nn.functional.cross_entropy(
            output.float().reshape(-1, output.shape[-1]), labels.reshape(-1),
            reduction="none")
        return losses.view_as(labels)

    def output_weight(self) -> torch.Tensor:
        """The output layer's weight (the embedding's when one chunk shares it)."""
        if self.model.share_embeddings_and_output_weights:
            return self.model.shared_embedding_or_output_weight()
        return self.model.output_layer.weight

    def logits_or_hidden(self, hidden: torch.Tensor | None, microbatch: Microbatch, *,
                         output_layer: bool = True) -> torch.Tensor:
        """The next activation ``[seq, batch, hidden]``, or on the last stage the logits
        ``[batch, seq, vocab]`` (``output_layer=False``: the final norm's output)."""
        device = next(self.parameters()).device
        batch, seq_len = microbatch.tokens.shape
        tp = self.tensor_parallel
        if tp.sequence_parallel and seq_len % tp.size:
            raise ValueError(f"sequence parallelism needs sequence lengths divisible by the "
                             f"tensor-parallel size {tp.size}; got {seq_len} (pad the "
                             f"microbatches to a multiple of it)")
        tokens = None
        if self.is_first:
            tokens = to_device(microbatch.tokens, device)
        else:
            if hidden is None:
                raise ValueError(f"stage {self.stage} needs an input activation")
            self.model.set_input_tensor(hidden)
        positions = None
        if self.is_first or self.inv_freq is not None:
            positions = to_device(microbatch.position_ids, device) \
                if microbatch.position_ids is not None else \
                torch.arange(seq_len, device=device).unsqueeze(0).expand(batch, seq_len)
        if self.context_parallel and hasattr(microbatch, "full_segment_ids"):
            full = microbatch.full_segment_ids  # full rows' documents, or causal over the ring
            mask = None if full is None else \
                PackedSegments(full, device, kernel=self.packed_kernel)
        elif self.context_parallel:  # a lane slot (--dynamic-context-parallel): own rows
            segments = microbatch.segment_ids
            mask = LocalRows(None if segments is None else
                             to_device(segments, device))
        elif microbatch.segment_ids is not None and self.implicit_causal:
            mask = PackedSegments(microbatch.segment_ids, device, kernel=self.packed_kernel)
        elif microbatch.segment_ids is not None:
            mask = packed_causal_mask(to_device(microbatch.segment_ids, device))
        elif self.implicit_causal:
            mask = self._short_rows(batch, seq_len, device)
        else:
            mask = causal_mask(seq_len, device)
        rotary = None if self.inv_freq is None else rotary_embedding(
            self.inv_freq, positions, same_rows=_same_rows(microbatch.position_ids))
        if rotary is not None and self.fused_rope:  # the SDPA core attention rotates q, k
            mask, rotary = RotaryInAttention(mask, rotary), None
        if rotary is not None and rotary.shape[1] > 1 and self.model.config.apply_rope_fusion:
            raise ValueError("fused RoPE (Transformer Engine) takes one position vector per "
                             "microbatch; packed rows with their own position ids need the "
                             "unfused path (uninstall transformer-engine or do not pack)")
        sequence_group = tp.group if tp.sequence_parallel else None
        with microbatch_scope(microbatch, seed=self.dropout_seed, device=device,
                              tensor_parallel=tp):  # keyed dropout (odc_pp.megatron.dropout)
            return gpt_chunk_forward(self.model, tokens, positions, mask, rotary,
                                     sequence_group=sequence_group, output_layer=output_layer)

    def _short_rows(self, batch: int, seq_len: int, device) -> PackedSegments | None:
        if self.full_length is None or self.tensor_parallel.sequence_parallel or \
                self.packed_kernel not in ("auto", "varlen"):
            return None
        config = self.model.config
        return short_row_segments(batch, seq_len, device, full_length=self.full_length,
                                  dtype=config.params_dtype, dropout=config.attention_dropout,
                                  head_dim=config.kv_channels)

    def input_shape(self, microbatch: Microbatch) -> tuple[torch.Size, torch.dtype]:
        """Shape and dtype of the activation this stage receives for ``microbatch``
        (under sequence parallelism this rank's sequence shard)."""
        batch, seq = microbatch.tokens.shape
        if self.tensor_parallel.sequence_parallel:
            seq //= self.tensor_parallel.size
        width = self.model.config.hidden_size
        return torch.Size([seq, batch, width]), self.model.config.params_dtype

    def output_shape(self, microbatch: Microbatch) -> tuple[torch.Size, torch.dtype]:
        """Shape and dtype of the activation this (non-last) stage produces."""
        return self.input_shape(microbatch)

    def residency_modules(self, *, keep_embedding: bool = False
                          ) -> list[torch.nn.Module | tuple[torch.nn.Module, bool]]:
        """What ``--odc-param-residency layer`` gathers per use: the embedding (forward
        only: its backward reads no weight), unless the output layer shares its weight or
        ``keep_embedding`` (the memory plan allows keeping it gathered), then the
        transformer layers, in order."""
        layers: list = list(self.model.decoder.layers)
        if self.is_first and not (keep_embedding or
                                  self.model.share_embeddings_and_output_weights):
            layers.insert(0, (self.model.embedding, False))
        return layers

    def global_named_parameters(self):
        """(name, param) with decoder layer indices made global and fused layernorm
        parameters (``recompute_lgd``) under their unfused names, so names, seeds and
        checkpoints do not depend on the layout or on recomputation."""
        for name, param in self.named_parameters():
            yield canonical_name(global_name(name, self.layers.start)), param


def tied_embedding_params(chunks: list[GPTChunk]) -> list[tuple[int, str]]:
    """The tied embedding copies on this rank when the embedding and the output layer
    live on different stages: ``(local chunk index, parameter name in the chunk)`` of the
    first stage's embedding and of the last stage's ``shared_embedding`` output layer
    (none without tying, or when one chunk shares a single weight)."""
    if not any(chunk.tied_across_stages for chunk in chunks):
        return []
    out = []
    for index, chunk in enumerate(chunks):
        for name, param in chunk.named_parameters():
            canonical = canonical_name(global_name(name, chunk.layers.start))
            if (chunk.is_first and canonical == EMBEDDING_WEIGHT) or \
                    getattr(param, "shared_embedding", False):
                out.append((index, name))
    return out


def global_name(local_name: str, first_layer: int) -> str:
    return re.sub(r"decoder\.layers\.(\d+)\.",
                  lambda match: f"decoder.layers.{int(match.group(1)) + first_layer}.",
                  local_name)


def build_chunks(config: ModelConfig, *, pp_rank: int, pp_size: int, num_chunks: int = 1,
                 placement: Placement | str = Placement.INTERLEAVED, seed: int = 1234,
                 process_groups=None,
                 tensor_parallel: TensorParallel | None = None,
                 cp_group=None, cp_comm_type: str = "p2p") -> list[GPTChunk]:
    """This rank's model chunks (local chunk order), initialised from ``seed``.

    ``tensor_parallel``: the tensor-parallel group and sequence-parallel setting
    (default tp = 1); every rank of the group builds the same stages and holds its shard
    of each parameter (:mod:`odc_pp.megatron.tp_layout`), initialised as the shard of
    the tp = 1 model. ``process_groups`` (required): megatron's ProcessGroupCollection,
    made by :func:`~odc_pp.megatron.compat.process_group_collection` from groups someone
    else made (training: ``Topology.megatron_groups``; scripts and tests:
    ``odc_pp.training.distributed.standalone_process_groups``), its tp group
    ``tensor_parallel``'s. Needs ``torch.distributed``. ``cp_group``: the context-parallel group (None or one
    rank: none); with more ranks every microbatch holds this rank's load-balanced part of
    the sequence (:mod:`odc_pp.megatron.context_parallel`) with explicit position ids,
    and the core attention is ``cp_comm_type`` ring (``p2p``) or all-to-all (``a2a``).
    """
    tensor_parallel = tensor_parallel or TensorParallel()
    if process_groups is None:
        raise ValueError("build_chunks needs process_groups: Topology.megatron_groups, or "
                         "standalone_process_groups() outside training")
    if cp_group is not None and dist.get_world_size(cp_group) == 1:
        cp_group = None
    _check_layout(config, tensor_parallel.size, pp_rank=pp_rank, pp_size=pp_size,
                  num_chunks=num_chunks)
    placement = Placement(placement)
    prepare_megatron_for_device(config.device, seed=seed)
    build = _ChunkBuild(
        config=config, seed=seed, num_stages=pp_size * num_chunks,
        layout=stage_layout(config, pp_size, num_chunks),
        tensor_parallel=tensor_parallel, cp_group=cp_group,
        groups=process_groups,
        spec=_layer_spec(config, tensor_parallel, cp_group, cp_comm_type),
        fused_rope=(config.position_embedding_type == "rope"
                    and config.core_attention == "sdpa" and cp_group is None
                    and not rope_fusion_available(config.device)
                    and use_fused_rope(config.fused_rope, config.device,
                                       _rope_shape(config, tensor_parallel.size))))
    return [build.chunk(stage_of(placement, pp_size, pp_rank, chunk))
            for chunk in range(num_chunks)]


def _check_layout(config: ModelConfig, tp_size: int, *, pp_rank: int, pp_size: int,
                  num_chunks: int) -> None:
    """ValueError where the model does not split over this layout."""
    groups_per_rank = config.num_query_groups or config.num_attention_heads
    for what, value in (("num_attention_heads", config.num_attention_heads),
                        ("num_query_groups", groups_per_rank),
                        ("vocab_size", config.vocab_size),
                        ("ffn_hidden_size", config.ffn_hidden_size or 4 * config.hidden_size)):
        if value % tp_size:
            raise ValueError(f"{what} {value} is not divisible by the tensor-parallel size "
                             f"{tp_size}")
    if not 0 <= pp_rank < pp_size:
        raise ValueError(f"pp_rank {pp_rank} outside 0..{pp_size - 1}")
    if num_chunks < 1:
        raise ValueError("num_chunks must be >= 1")


def _rope_shape(config: ModelConfig, tp_size: int) -> tuple:
    """The RoPE kernels' real shape: (query heads, K/V heads per rank, head dim, dtype)."""
    heads = config.num_attention_heads
    dim = config.kv_channels or config.hidden_size // heads
    return (heads // tp_size, (config.num_query_groups or heads) // tp_size, dim,
            config.dtype)


def _layer_spec(config: ModelConfig, tensor_parallel: TensorParallel, cp_group,
                cp_comm_type: str):
    """The transformer layer's ModuleSpec for this model and layout."""
    swiglu = config.activation == "swiglu"
    return deferrable_gpt_layer_spec(
        recompute_lgd=config.recompute_lgd, core_attention=config.core_attention,
        normalization=config.normalization, qk_layernorm=config.qk_layernorm,
        sequence_parallel=tensor_parallel.sequence_parallel,
        zero_centered_gamma=config.apply_layernorm_1p, swiglu=swiglu,
        fused_swiglu=swiglu and use_fused_swiglu(
            config.fused_swiglu, config.device,
            ((config.ffn_hidden_size or 4 * config.hidden_size) // tensor_parallel.size,
             config.dtype)),
        cp_group=cp_group, cp_comm_type=cp_comm_type)


@dataclass(kw_only=True)
class _ChunkBuild:
    """What every chunk of one :func:`build_chunks` call shares: the model, its seed, the
    virtual stage count, the tp and cp layout, megatron's process groups, the layer's
    ModuleSpec, and whether q and k rotate in the Triton RoPE kernel."""

    config: ModelConfig
    seed: int
    num_stages: int
    layout: StageLayout
    tensor_parallel: TensorParallel
    cp_group: object
    groups: object
    spec: object
    fused_rope: bool

    def chunk(self, stage: int) -> GPTChunk:
        """The chunk holding virtual ``stage``, initialised."""
        config, tensor_parallel = self.config, self.tensor_parallel
        last = stage == self.num_stages - 1
        layers = self.layout.layers(stage)
        # a stage of the embedding or the loss alone (the split accounting for them)
        # builds no decoder layer from a config of one (megatron-core's, too, is larger)
        model = new_gpt_model(_transformer_config(config, max(len(layers), 1),
                                                  tensor_parallel),
                              self.spec, num_layers=len(layers), vocab_size=config.vocab_size,
                              max_sequence_length=config.max_sequence_length,
                              pre_process=stage == 0, post_process=last,
                              process_groups=self.groups,
                              position_embedding_type=config.position_embedding_type,
                              rotary_base=config.rotary_base,
                              tie_embeddings=config.tie_embeddings and self.num_stages == 1)
        inv_freq = None
        if config.position_embedding_type == "rope":
            inv_freq = rope_inv_freq(model, scaling=config.rope_scaling).to(config.device)
        if last:
            deferrable_output_layer(model)
        if stage == 0:
            use_main_grad_lookup(model.embedding.word_embeddings)
        use_keyed_embedding_dropout(model, layers.start)
        if config.recompute_method is not None:
            apply_full_recompute(model.decoder, config.recompute_method,
                                 config.recompute_num_layers)
        for module in model.modules():
            if hasattr(module, "keep_sp_input_for_w"):
                module.keep_sp_input_for_w = tensor_parallel.keep_sp_input_for_w
        gpt_chunk = GPTChunk(model, stage=stage, num_stages=self.num_stages, layers=layers,
                             inv_freq=inv_freq,
                             implicit_causal=config.core_attention == "sdpa",
                             packed_kernel=config.packed_attention,
                             tensor_parallel=tensor_parallel)
        self._configure(gpt_chunk, last)
        initialize_parameters(gpt_chunk, config, self.seed)
        reduce_partial_grads(gpt_chunk.global_named_parameters(), tensor_parallel)
        return gpt_chunk

    def _configure(self, gpt_chunk: GPTChunk, last: bool) -> None:
        """Kernels, device, dtype and the tied-embedding mark of a built chunk."""
        config = self.config
        gpt_chunk.context_parallel = self.cp_group is not None
        gpt_chunk.full_length = config.max_sequence_length
        gpt_chunk.fused_rope = self.fused_rope
        gpt_chunk.dropout_seed = self.seed
        gpt_chunk.fused_cross_entropy = use_fused_cross_entropy(
            config.fused_cross_entropy, config.device,
            tensor_parallel=self.tensor_parallel.size)
        gpt_chunk.to(device=config.device, dtype=config.dtype)
        if gpt_chunk.is_last and gpt_chunk.fused_cross_entropy:  # the real vocabulary's kernel
            warm_cross_entropy(gpt_chunk.output_weight())
        gpt_chunk.tied_across_stages = config.tie_embeddings and self.num_stages > 1
        if gpt_chunk.tied_across_stages and last:
            gpt_chunk.model.output_layer.weight.shared_embedding = True


def _transformer_config(config: ModelConfig, num_layers: int,
                        tensor_parallel: TensorParallel):
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(
        tensor_model_parallel_size=tensor_parallel.size,
        sequence_parallel=tensor_parallel.sequence_parallel,
        num_layers=num_layers, hidden_size=config.hidden_size,
        num_attention_heads=config.num_attention_heads,
        ffn_hidden_size=config.ffn_hidden_size or 4 * config.hidden_size,
        hidden_dropout=config.hidden_dropout, attention_dropout=config.attention_dropout,
        init_method_std=config.init_method_std, params_dtype=config.dtype,
        bf16=config.dtype is torch.bfloat16, fp16=config.dtype is torch.float16,
        use_cpu_initialization=True, perform_initialization=False,
        masked_softmax_fusion=False, bias_activation_fusion=False, bias_dropout_fusion=False,
        apply_rope_fusion=config.position_embedding_type == "rope" and
        rope_fusion_available(config.device),
        gradient_accumulation_fusion=False, persist_layer_norm=False,
        normalization=config.normalization, layernorm_epsilon=config.norm_epsilon,
        layernorm_zero_centered_gamma=config.apply_layernorm_1p,
        gated_linear_unit=config.activation == "swiglu",
        activation_func=torch.nn.functional.silu if config.activation == "swiglu"
        else torch.nn.functional.gelu,
        num_query_groups=config.num_query_groups or config.num_attention_heads,
        kv_channels=config.kv_channels, add_bias_linear=config.add_bias_linear,
        add_qkv_bias=config.add_qkv_bias, qk_layernorm=config.qk_layernorm,
        # the MLP takes its activation from the spec: SwiGLU saving only its input, or
        # (recompute_lgd) the identity, linear_fc2 applying GeLU / SwiGLU itself; no
        # Transformer Engine is involved
        use_te_activation_func=config.recompute_lgd or config.activation == "swiglu")


@torch.no_grad()
def initialize_parameters(chunk: GPTChunk, config: ModelConfig, seed: int) -> None:
    """Re-initialise every parameter from (seed, global name): layout independent."""
    output_std = config.init_method_std / math.sqrt(2.0 * config.num_layers)
    tp = chunk.tensor_parallel
    for name, param in chunk.global_named_parameters():
        if getattr(param, "shared_embedding", False):  # tied copy: the embedding's values
            name = EMBEDDING_WEIGHT
        generator = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
        partition = partition_of(name, gated_mlp=config.activation == "swiglu")
        shape = partition.full_shape(param.shape, tp.size)
        if name.endswith("bias"):
            value = torch.zeros(shape)
        elif "norm" in name:  # zero-centred (--apply-layernorm-1p): 1 + 0
            value = torch.zeros(shape) if config.apply_layernorm_1p else torch.ones(shape)
        else:
            std = output_std if ("linear_proj" in name or "linear_fc2" in name) \
                else config.init_method_std
            value = torch.randn(shape, generator=generator) * std
        param.copy_(partition.shard(value, tp.rank, tp.size).to(param.dtype))
