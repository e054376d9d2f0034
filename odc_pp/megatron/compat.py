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
(:func:`singleton_process_groups`,     embd, pos_embd, mp, tp_cp, dp, dp_cp);
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
Layer spec                             ``get_gpt_layer_local_spec()`` submodule names;    0.16.1
(:mod:`odc_pp.megatron.spec`)          the MLP's spec activation under
                                       ``use_te_activation_func=True``
=====================================  =================================================  ======

Only 0.16.1 has been run (the pin in pyproject.toml); any other version is untested, and
the rows above are where a difference would show.

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

Rotary embeddings also move ``inv_freq`` to CUDA, so CPU models use learned absolute
position embeddings. ``parallel_state`` is never initialised: every module receives an
explicit :class:`ProcessGroupCollection` (see :func:`singleton_process_groups`), so the
runtime's pipeline layout is invisible to megatron (each chunk is a 1-stage model).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core.fusions.fused_bias_dropout import _bias_dropout_add_func
from megatron.core.transformer.dot_product_attention import DotProductAttention

__all__ = ["prepare_megatron_for_device", "singleton_process_groups", "causal_mask",
           "HostDotProductAttention", "unfused_bias_dropout_add", "new_gpt_model"]


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


def singleton_process_groups():
    """A ProcessGroupCollection whose groups hold only this process (TP=CP=1).

    ``torch.distributed`` must be initialised. Collective over the default group: every
    process calls ``new_group`` for every rank, as ``torch.distributed`` requires.
    """
    from megatron.core.process_groups_config import ProcessGroupCollection

    if not dist.is_initialized():
        raise ValueError("initialise torch.distributed (e.g. gloo) before building the model")
    own_group = None
    for rank in range(dist.get_world_size()):
        group = dist.new_group([rank])
        if rank == dist.get_rank():
            own_group = group
    return ProcessGroupCollection(tp=own_group, pp=own_group, cp=own_group, embd=own_group,
                                  pos_embd=own_group, mp=own_group, tp_cp=own_group,
                                  dp=own_group, dp_cp=own_group)


def new_gpt_model(transformer_config, layer_spec, *, vocab_size: int,
                  max_sequence_length: int, pre_process: bool, post_process: bool,
                  process_groups):
    """megatron's ``GPTModel`` with untied embeddings, learned absolute positions and
    explicit process groups (``parallel_state`` stays uninitialised)."""
    from megatron.core.models.gpt.gpt_model import GPTModel

    return GPTModel(transformer_config, layer_spec, vocab_size=vocab_size,
                    max_sequence_length=max_sequence_length, pre_process=pre_process,
                    post_process=post_process, share_embeddings_and_output_weights=False,
                    position_embedding_type="learned_absolute", pg_collection=process_groups)


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
