"""Everything in odc_pp that depends on the megatron-core version, in one place.

odc_pp uses megatron-core as a library, without forking or patching it. What follows
reaches past its stable surface (private names, internal attributes, constructor
keywords that appeared in recent releases); no other module of odc_pp does.

=====================================  =================================================  ======
What                                   megatron-core names relied on                      Tested
=====================================  =================================================  ======
RNG tracker for CPU / GPU              ``initialize_rng_tracker(inference_rng_tracker=,   0.16.1
(:func:`prepare_megatron_for_device`)  force_reset=)``; private
                                       ``_MODEL_PARALLEL_RNG_TRACKER_NAME``
Explicit process groups, TP=CP=1       ``ProcessGroupCollection`` fields (tp, pp, cp,     0.16.1
(:func:`process_group_collection`,     embd, pos_embd, mp, tp_cp, dp, dp_cp);
:func:`new_gpt_model`)                 ``GPTModel(pg_collection=)``
Host attention                         ``DotProductAttention.forward`` arguments;         0.16.1
(:class:`HostDotProductAttention`)     attributes ``softmax_scale``,
                                       ``scale_mask_softmax``, ``softmax_offset``,
                                       ``attention_dropout``, ``num_*_per_partition``,
                                       ``hidden_size_per_partition``
Unfused bias-dropout-add               private                                            0.16.1
(:func:`unfused_bias_dropout_add`)     ``fused_bias_dropout._bias_dropout_add_func``
Deferrable linears                     ``ColumnParallelLinear`` / ``RowParallelLinear``:  0.16.1
(:mod:`odc_pp.megatron.layers`)        ``_forward_impl``, ``tp_group``, ``input_size``
Deferrable output layer                ``GPTModel.output_layer`` attributes              0.16.1
(:func:`deferrable_output_layer`)      ``input_size``, ``output_size``, ``config``,
                                       ``bias``, ``skip_bias_add``, ``gather_output``,
                                       ``weight`` (None when tied), ``tp_group``
SP embedding reduce-scatter            ``LanguageModelEmbedding`` attributes               0.16.1
(:func:`sequence_parallel_embedding`)  ``word_embeddings`` (``vocab_start_index``,
                                       ``vocab_end_index``, ``weight``,
                                       ``deterministic_mode``), ``add_position_embedding``,
                                       ``tokentype_embeddings``, ``embedding_dropout``
Layer spec                             ``get_gpt_layer_local_spec(normalization=,         0.16.1
(:mod:`odc_pp.megatron.spec`)          qk_layernorm=)`` submodule names; the MLP's spec   0.17.1
                                       activation under ``use_te_activation_func=True``   0.19.2
MLP submodules of a layer spec         0.16: ``ModuleSpec.submodules``; 0.17+: a          0.16.1
(:func:`mlp_submodules`)               builder ``functools.partial(MLP.as_mlp_submodule,  0.17.1
                                       submodules=MLPSubmodules(...))``                   0.19.2
Checkpoint keys                        ``GPTModel.sharded_state_dict(metadata=            0.16.1
(:func:`megatron_sharded_state_dict`)  {"dp_cp_group": ...})`` (no ``parallel_state``)    0.17.1
                                                                                          0.19.2
torch_dist save / load on CPU          ``dist_checkpointing.save`` calls                  0.16.1
(:func:`cpu_dist_checkpointing`)       ``torch.cuda.synchronize`` and                     0.17.1
                                       ``torch.cuda.current_device`` (needs psutil)       0.19.2
Chunk forward without                  ``GPTModel`` attributes ``embedding``, ``decoder``  0.16.1
``GPTModel.forward``                   (``TransformerBlock.forward(hidden_states=,
(:func:`gpt_chunk_forward`)            attention_mask=, rotary_pos_emb=)``),
                                       ``output_layer(x, weight=)``,
                                       ``share_embeddings_and_output_weights``,
                                       ``shared_embedding_or_output_weight()``
RoPE frequencies                       ``GPTModel.rotary_pos_emb.inv_freq`` and the        0.16.1
(:func:`rope_inv_freq`)                private ``RotaryEmbedding._apply_scaling(freqs,
                                       factor=, low_freq_factor=, high_freq_factor=,
                                       original_max_position_embeddings=)``
Fused RoPE on GPU                      ``TransformerConfig.apply_rope_fusion`` (needs      untested
(:func:`rope_fusion_available`)        Transformer Engine's ``fused_apply_rotary_pos_emb``)
SDPA core attention on GPU             the same ``DotProductAttention`` attributes as the  CPU only
(:class:`SdpaDotProductAttention`)     host attention
Context-parallel core attention       ``DotProductAttention.__init__(cp_comm_type=,        0.16.1
(:mod:`odc_pp.megatron.cp_attention`)  pg_collection=)`` and its ``context_parallel_size
                                       == 1`` assertion (a copied config with size 1);
                                       ``scale_mask_softmax.scale``, ``softmax_scale``,
                                       ``softmax_offset``, ``attention_dropout``,
                                       ``hidden_size_per_partition``; ``SelfAttention``
                                       calls ``core_attention(..., cp_comm_type=)``
=====================================  =================================================  ======

Run: 0.16.1 (``make test``, Python 3.11) and 0.17.1 / 0.19.2 (``make test-mcore-all``,
Python 3.12, the tests that touch megatron-core; logs in benchmarks/results/mcore_lane_*.txt).
The pin in pyproject.toml is ``>=0.16.1,<0.20``; another version is untested, and the rows
above are where a difference would show.

CPU. megatron-core 0.16 hard-codes CUDA in three places that a CPU run reaches, each
avoided through an extension point instead of a patch:

1. ``DotProductAttention`` takes its score buffer from ``parallel_state``'s global memory
   buffer, which allocates on ``torch.cuda.current_device()``. Our layer spec plugs in
   :class:`HostDotProductAttention`, a subclass that allocates on the query's device.
2. The CUDA RNG tracker's ``fork()`` swaps CUDA generator states. On CPU we install
   megatron's own no-op-fork tracker (``initialize_rng_tracker(inference_rng_tracker=
   True)``): dropout then draws from the default (CPU) generator. Only done when
   ``device`` is CPU; the GPU path keeps megatron's normal tracker.
3. The causal mask defaults to ``get_default_causal_mask``, built on "cuda". The runtime
   always passes an explicit boolean mask (:func:`causal_mask`) built on the activation's
   device, so the default is never reached.

Rotary embeddings. ``RotaryEmbedding.forward`` moves ``inv_freq`` to CUDA and only knows
positions ``0..s-1``, so the chunks never call it (nor ``GPTModel.forward``, which calls
it): :func:`gpt_chunk_forward` runs the model's embedding, decoder and output layer itself
and hands the decoder a rotary embedding built from the microbatch's ``position_ids``
(:func:`rotary_embedding`) with megatron's own frequencies (:func:`rope_inv_freq`).
Megatron's ``apply_rotary_pos_emb`` then applies it inside ``SelfAttention``: unfused on
CPU; on GPU fused when Transformer Engine's kernel is importable (only for rows that share
one position vector: the fused kernel takes ``[s, 1, 1, d]`` frequencies).

Attention. CPU: :class:`HostDotProductAttention` (megatron's math with an explicit mask).
CUDA: :class:`SdpaDotProductAttention`, ``torch.nn.functional.scaled_dot_product_attention``
(flash / memory-efficient kernels; causal without a mask; packed rows as
:class:`~odc_pp.megatron.packed_attention.PackedSegments`: varlen flash attention,
FlexAttention with a document mask, or the dense mask of :func:`packed_causal_mask` as the
fallback, see :mod:`odc_pp.megatron.packed_attention`). ``parallel_state`` is never initialised: every module receives an
explicit :class:`ProcessGroupCollection` (see :func:`process_group_collection`), so the
runtime's pipeline layout is invisible to megatron (each chunk is a 1-stage model).
"""

from __future__ import annotations

import contextlib
import functools

import torch
import torch.distributed as dist
from megatron.core.fusions.fused_bias_dropout import _bias_dropout_add_func
from megatron.core.transformer.dot_product_attention import DotProductAttention

from .packed_attention import PackedSegments, packed_attention, packed_causal_mask
from .rms_norm import RMSNorm, RMSNorm1P
from .rope_triton import RotaryInAttention

__all__ = ["prepare_megatron_for_device", "process_group_collection", "causal_mask",
           "packed_causal_mask", "HostDotProductAttention", "SdpaDotProductAttention",
           "unfused_bias_dropout_add", "new_gpt_model", "gpt_chunk_forward", "rope_inv_freq",
           "rotary_embedding", "rope_fusion_available", "deferrable_output_layer",
           "sequence_parallel_embedding", "mlp_submodules", "megatron_sharded_state_dict",
           "cpu_dist_checkpointing",
           "TorchNorm", "LayerNorm1P", "RMSNorm1P"]


def prepare_megatron_for_device(device: torch.device | str, *, seed: int = 1234) -> None:
    """Install the RNG tracker megatron-core needs on ``device`` (idempotent).

    CPU: megatron's no-op-fork tracker. GPU: megatron's CUDA tracker with its
    model-parallel state seeded from ``seed`` if none was added yet (TP=1, so the usual
    per-TP-rank offset does not apply).
    """
    from megatron.core.tensor_parallel import random as megatron_random

    device = torch.device(device)
    if device.type == "cpu":
        megatron_random.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
        return
    tracker = megatron_random.get_cuda_rng_tracker()
    name = megatron_random._MODEL_PARALLEL_RNG_TRACKER_NAME
    if name not in tracker.get_states():
        tracker.add(name, seed)


def process_group_collection(own, *, tp=None):
    """megatron's :class:`ProcessGroupCollection` for one of odc-pp's chunks: ``own`` (the
    group of this process alone) for every group megatron sees (pp, cp, embd, dp: each
    chunk is a one-stage, one-replica model to megatron), except the tensor-parallel ones
    (tp, tp_cp, mp) when a ``tp`` group is given. Makes no group: the groups are made by
    ``odc_pp.training.distributed.Topology.build`` (or, outside training,
    ``odc_pp.training.distributed.standalone_process_groups``)."""
    from megatron.core.process_groups_config import ProcessGroupCollection

    tp = own if tp is None else tp
    return ProcessGroupCollection(tp=tp, pp=own, cp=own, embd=own, pos_embd=own, mp=tp,
                                  tp_cp=tp, dp=own, dp_cp=own)


def mlp_submodules(layer_spec):
    """The ``MLPSubmodules`` (``linear_fc1``, ``activation_func``, ``linear_fc2``) of a
    transformer layer spec, to edit in place: megatron-core <= 0.16 describes the MLP as a
    ``ModuleSpec`` (``.submodules``); 0.17+ as a builder, ``functools.partial(
    MLP.as_mlp_submodule, submodules=MLPSubmodules(...))``."""
    mlp = layer_spec.submodules.mlp
    if isinstance(mlp, functools.partial):
        return mlp.keywords["submodules"]
    return mlp.submodules


def megatron_sharded_state_dict(model, process_groups) -> dict:
    """``model.sharded_state_dict()`` (megatron's checkpoint keys) without
    ``parallel_state``: the data-parallel group its replica ids need is given as
    ``metadata["dp_cp_group"]`` (megatron-core >= 0.16 reads it from there)."""
    return model.sharded_state_dict(metadata={"dp_cp_group": process_groups.dp_cp})


@contextlib.contextmanager
def cpu_dist_checkpointing():
    """Run megatron's ``dist_checkpointing.save`` / ``load`` on a machine without CUDA.
    Its torch_dist writer calls ``torch.cuda.synchronize()`` after staging tensors to the
    host and broadcasts a failure flag on ``torch.cuda.current_device()``; without CUDA
    both are pointed at the CPU for the duration (nothing changes where CUDA exists)."""
    if torch.cuda.is_available():
        yield
        return
    synchronize, current_device = torch.cuda.synchronize, torch.cuda.current_device
    torch.cuda.synchronize = lambda *args, **kwargs: None
    torch.cuda.current_device = lambda: "cpu"
    try:
        yield
    finally:
        torch.cuda.synchronize, torch.cuda.current_device = synchronize, current_device


class LayerNorm1P(torch.nn.LayerNorm):
    """``torch.nn.LayerNorm`` with a zero-centred weight (Megatron's
    ``--apply-layernorm-1p``, ``layernorm_zero_centered_gamma``): the stored weight
    starts at 0 and the output is scaled by ``1 + weight``."""

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if self.weight is not None:
            torch.nn.init.zeros_(self.weight)

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002
        return torch.nn.functional.layer_norm(input, self.normalized_shape, self.weight + 1,
                                              self.bias, self.eps)


class TorchNorm:
    """torch's ``LayerNorm`` / our :class:`~odc_pp.megatron.rms_norm.RMSNorm` (torch's,
    keeping only what a fused kernel keeps), built as megatron's ``WrappedTorchNorm``
    builds them, but also under sequence parallelism (which ``WrappedTorchNorm`` refuses
    because nothing sums the norm's partial gradients over the tensor-parallel ranks;
    :func:`odc_pp.megatron.tp.reduce_partial_grads` does) and with a zero-centred weight
    (``config.layernorm_zero_centered_gamma``: :class:`LayerNorm1P` / :class:`RMSNorm1P`,
    which ``WrappedTorchNorm`` refuses)."""

    def __new__(cls, config, hidden_size: int, eps: float = 1e-5, **kwargs):
        norms = {"LayerNorm": torch.nn.LayerNorm, "RMSNorm": RMSNorm}
        if config.layernorm_zero_centered_gamma:
            norms = {"LayerNorm": LayerNorm1P, "RMSNorm": RMSNorm1P}
        if config.normalization not in norms:
            raise ValueError(f"normalization must be one of {sorted(norms)}, got "
                             f"{config.normalization!r}")
        return norms[config.normalization](normalized_shape=hidden_size, eps=eps)


def deferrable_output_layer(model) -> None:
    """Give the last stage's output layer a deferrable weight gradient: megatron builds it
    inside ``GPTModel`` as a plain ``ColumnParallelLinear`` (not from the layer spec), so
    it is rebuilt here with the same arguments as
    :class:`~odc_pp.megatron.layers.DeferrableColumnParallelLinear` (parameters are
    re-initialised by name afterwards; a tied layer keeps no weight of its own). Its
    W is then the deferred ``grad_logits^T @ hidden`` like every other linear's, and under
    sequence parallelism the layer gathers the sequence itself in F and reduce-scatters
    the input gradient in B (megatron's gather allocates from a CUDA-only buffer)."""
    from .layers import DeferrableColumnParallelLinear

    old = model.output_layer
    new = DeferrableColumnParallelLinear(
        old.input_size, old.output_size, config=old.config,
        init_method=old.config.init_method, bias=old.bias is not None,
        skip_bias_add=old.skip_bias_add, gather_output=old.gather_output,
        skip_weight_param_allocation=old.weight is None, tp_group=old.tp_group)
    if new.weight is not None:
        new.weight.is_embedding_or_output_parameter = True
    model.output_layer = new


def new_gpt_model(transformer_config, layer_spec, *, vocab_size: int,
                  max_sequence_length: int, pre_process: bool, post_process: bool,
                  process_groups, position_embedding_type: str = "learned_absolute",
                  rotary_base: float = 10000.0, tie_embeddings: bool = False,
                  num_layers: int | None = None):
    """megatron's ``GPTModel`` with explicit process groups (``parallel_state`` stays
    uninitialised). ``tie_embeddings`` only when this chunk holds both the embedding and
    the output layer (megatron then reuses the embedding weight, no all-reduce).
    ``num_layers``: the decoder layers to build (None: the config's; 0: a chunk holding
    only the embedding or the loss, Megatron's split accounting for them)."""
    from megatron.core.models.gpt.gpt_model import GPTModel

    if tie_embeddings and not (pre_process and post_process):
        raise ValueError("a shared embedding weight needs the embedding and the output "
                         "layer in one chunk (across stages: two tied copies, "
                         "odc_pp.megatron.model.tied_embedding_params)")
    extra = {}
    if position_embedding_type == "rope":
        extra = {"rotary_base": rotary_base, "rotary_percent": 1.0, "rope_scaling": False}
    own_norm = transformer_config.sequence_parallel or \
        transformer_config.layernorm_zero_centered_gamma
    if own_norm or num_layers not in (None, transformer_config.num_layers):
        # the block's final norm is not part of the layer spec: name it explicitly
        from megatron.core.transformer import transformer_block

        layer_spec = transformer_block.TransformerBlockSubmodules(
            layer_specs=[layer_spec] * (transformer_config.num_layers if num_layers is None
                                        else num_layers),
            layer_norm=TorchNorm if own_norm else transformer_block.LayerNormImpl)
    return GPTModel(transformer_config, layer_spec, vocab_size=vocab_size,
                    max_sequence_length=max_sequence_length, pre_process=pre_process,
                    post_process=post_process,
                    share_embeddings_and_output_weights=tie_embeddings,
                    position_embedding_type=position_embedding_type,
                    # under sequence parallelism gpt_chunk_forward scatters the embedding
                    # output itself, or reduce-scatters it without learned positions
                    # (sequence_parallel_embedding; megatron's allocate on CUDA)
                    scatter_embedding_sequence_parallel=False,
                    pg_collection=process_groups, **extra)


def gpt_chunk_forward(model, tokens, positions, attention_mask, rotary_pos_emb=None, *,
                      sequence_group=None, output_layer: bool = True):
    """What ``GPTModel.forward`` does for training without labels, with a given rotary
    embedding: embedding (first stage; learned positions from ``positions``), decoder
    (later stages read the tensor of ``set_input_tensor``), output layer (last stage;
    logits ``[batch, seq, vocab / tp]``); otherwise the hidden states
    ``[seq, batch, hidden]`` (under sequence parallelism this rank's sequence shard).
    ``sequence_group``: sequence parallelism on that group (the embedding output is
    scattered here; the output layer gathers the sequence itself,
    :func:`deferrable_output_layer`). ``output_layer=False``: the last stage returns the
    final norm's output ``[seq, batch, hidden]`` (the fused loss applies the layer)."""
    from .tp import scatter_sequence

    hidden = None
    if model.pre_process:
        embedding = model.embedding
        if sequence_group is not None and not embedding.add_position_embedding and \
                embedding.tokentype_embeddings is None:
            hidden = sequence_parallel_embedding(embedding, tokens, sequence_group)
        else:
            hidden = embedding(input_ids=tokens, position_ids=positions)
            if sequence_group is not None:
                hidden = scatter_sequence(hidden, sequence_group)
    hidden = model.decoder(hidden_states=hidden, attention_mask=attention_mask,
                           rotary_pos_emb=rotary_pos_emb)
    if not model.post_process or not output_layer:
        return hidden
    weight = model.shared_embedding_or_output_weight() \
        if model.share_embeddings_and_output_weights else None
    logits, _ = model.output_layer(hidden, weight=weight)
    return logits.transpose(0, 1).contiguous()


def sequence_parallel_embedding(embedding, tokens: torch.Tensor, group) -> torch.Tensor:
    """``LanguageModelEmbedding.forward`` under sequence parallelism without learned
    positions (RoPE models), as megatron's ``reduce_scatter_embeddings`` path does it:
    this rank's vocabulary rows looked up (:func:`~odc_pp.megatron.embedding_grad.
    vocab_rows`: their gradient into ``main_grad`` where the engine gave one), the
    partial ``[s, b, h]`` reduce-scattered along the sequence (megatron's reduce-scatter allocates on CUDA, so
    :func:`~odc_pp.megatron.tp.reduce_scatter_sequence`), then dropout on the shard in
    the tensor-parallel RNG fork. Half the bytes of all-reducing then splitting."""
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    from .embedding_grad import vocab_rows
    from .tp import reduce_scatter_sequence

    rows = vocab_rows(embedding.word_embeddings, tokens)
    hidden = reduce_scatter_sequence(rows.transpose(0, 1).contiguous(), group)
    if embedding.config.fp32_residual_connection:
        hidden = hidden.float()
    with get_cuda_rng_tracker().fork():
        return embedding.embedding_dropout(hidden)


def rope_inv_freq(model, *, scaling: dict | None = None) -> torch.Tensor:
    """fp32 inverse frequencies of ``model``'s megatron ``RotaryEmbedding`` (built from
    ``rotary_base``), with Llama-3 scaling when ``scaling`` gives ``factor``,
    ``low_freq_factor``, ``high_freq_factor`` and ``original_max_position_embeddings``."""
    rotary = model.rotary_pos_emb
    inv_freq = rotary.inv_freq.detach().to("cpu", torch.float32)
    if scaling:
        inv_freq = rotary._apply_scaling(
            inv_freq, factor=scaling["factor"], low_freq_factor=scaling["low_freq_factor"],
            high_freq_factor=scaling["high_freq_factor"],
            original_max_position_embeddings=scaling["original_max_position_embeddings"])
    return inv_freq


def rotary_embedding(inv_freq: torch.Tensor, positions: torch.Tensor, *,
                     same_rows: bool | None = None) -> torch.Tensor:
    """Megatron's rotary embedding layout ``[seq, batch, 1, dim]`` (non-interleaved: the
    angles repeated over both halves) for ``positions`` ``[batch, seq]``; ``batch`` is 1
    when every row has the same positions (what the fused kernel takes). ``same_rows``:
    whether they do, decided by the caller on the host (None: compared here, which
    synchronises with a GPU)."""
    if same_rows is None:
        same_rows = positions.shape[0] == 1 or bool((positions == positions[:1]).all())
    if same_rows and positions.shape[0] > 1:
        positions = positions[:1]
    angles = positions.to(torch.float32).unsqueeze(-1) * inv_freq.to(positions.device)
    return torch.cat((angles, angles), dim=-1).transpose(0, 1).unsqueeze(2)


def rope_fusion_available(device: torch.device | str) -> bool:
    """Megatron's fused RoPE can run: a CUDA device and Transformer Engine's kernel."""
    if torch.device(device).type != "cuda":
        return False
    from megatron.core.models.common.embeddings import rope_utils

    return getattr(rope_utils, "fused_apply_rotary_pos_emb", None) is not None


def causal_mask(seq_len: int, device: torch.device | str) -> torch.Tensor:
    """Megatron's boolean mask convention: True marks positions that may NOT attend."""
    return torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool, device=device),
                      diagonal=1)[None, None]


def unfused_bias_dropout_add(x_with_bias, residual, prob: float, training: bool):
    """megatron's unfused ``residual + dropout(x + bias)`` (what ``get_bias_dropout_add``
    returns with ``fused=False``)."""
    return _bias_dropout_add_func(x_with_bias, residual, prob, training)


class HostDotProductAttention(DotProductAttention):
    """Megatron's unfused attention with its score buffer allocated on the input's device
    (the parent takes it from a CUDA-only global buffer) and dropout on the default
    generator. Same math: scaled QK^T, megatron's mask+softmax module, dropout, PV."""

    def forward(self, query, key, value, attention_mask, attn_mask_type=None,
                attention_bias=None, packed_seq_params=None):
        if packed_seq_params is not None or attention_bias is not None:
            raise ValueError("HostDotProductAttention supports neither packed sequences "
                             "nor attention bias")
        if attention_mask is None:
            raise ValueError("pass an explicit attention mask (compat.causal_mask)")
        if isinstance(attention_mask, PackedSegments):
            attention_mask = attention_mask.dense_mask()
        groups = self.num_attention_heads_per_partition // self.num_query_groups_per_partition
        if groups > 1:
            key = key.repeat_interleave(groups, dim=2)
            value = value.repeat_interleave(groups, dim=2)
        seq_q, batch, heads, head_dim = query.shape
        # [s, b, n, d] -> [b*n, s, d]
        query = query.reshape(seq_q, batch * heads, head_dim).transpose(0, 1)
        key = key.reshape(key.shape[0], batch * heads, head_dim).transpose(0, 1)
        value = value.reshape(value.shape[0], batch * heads, head_dim).transpose(0, 1)
        scores = torch.bmm(query, key.transpose(1, 2)) * self.softmax_scale
        scores = scores.view(batch, heads, seq_q, key.shape[1])
        probs = self.scale_mask_softmax(scores, attention_mask, self.softmax_offset)
        probs = self.attention_dropout(probs)
        context = torch.bmm(probs.view(batch * heads, seq_q, -1), value)
        # [b*n, s, d] -> [s, b, n*d]
        context = context.view(batch, heads, seq_q, head_dim).permute(2, 0, 1, 3)
        return context.reshape(seq_q, batch, self.hidden_size_per_partition)


class SdpaDotProductAttention(DotProductAttention):
    """Core attention through ``torch.nn.functional.scaled_dot_product_attention`` (CUDA:
    flash or memory-efficient kernels, no ``b x heads x s^2`` score tensor in fp32).
    ``attention_mask`` None: causal (``is_causal``, the flash path); a
    :class:`~odc_pp.megatron.packed_attention.PackedSegments`: packed documents through
    :func:`~odc_pp.megatron.packed_attention.packed_attention` (varlen / FlexAttention /
    dense mask, no ``s x s`` mask on the flash paths); otherwise megatron's boolean mask
    (True: may NOT attend). GQA through ``enable_gqa`` (K/V never expanded). Same math as
    :class:`HostDotProductAttention`. A
    :class:`~odc_pp.megatron.rope_triton.RotaryInAttention` around the mask: queries and
    keys are rotated here first (``--fused-rope``; megatron was given no rotary
    embedding)."""

    def forward(self, query, key, value, attention_mask, attn_mask_type=None,
                attention_bias=None, packed_seq_params=None):
        if packed_seq_params is not None or attention_bias is not None:
            raise ValueError("SdpaDotProductAttention takes packed sequences as "
                             "PackedSegments (segment ids), not PackedSeqParams, and no "
                             "attention bias")
        if isinstance(attention_mask, RotaryInAttention):  # --fused-rope
            query, key = attention_mask.apply(query, key)
            attention_mask = attention_mask.mask
        seq_q, batch = query.shape[0], query.shape[1]
        # [s, b, n, d] -> [b, n, s, d]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        gqa = q.shape[1] != k.shape[1]
        dropout = self.attention_dropout.p if self.training else 0.0
        if isinstance(attention_mask, PackedSegments):
            context = packed_attention(q, k, v, attention_mask, scale=self.softmax_scale,
                                       dropout=dropout)
        elif attention_mask is None:
            context = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, dropout_p=dropout, is_causal=True, scale=self.softmax_scale,
                enable_gqa=gqa)
        else:
            context = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=~attention_mask, dropout_p=dropout,
                scale=self.softmax_scale, enable_gqa=gqa)
        # [b, n, s, d] -> [s, b, n*d]
        return context.permute(2, 0, 1, 3).reshape(seq_q, batch, self.hidden_size_per_partition)
