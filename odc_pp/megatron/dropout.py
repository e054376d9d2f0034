"""Layout-invariant dropout: every mask is a counter-based hash of the data, not an RNG stream.

megatron-core draws its dropout masks from per-rank generators in execution order, so a
different pipeline, data-parallel or tensor-parallel layout (or a different schedule, or a
resumed run) draws different masks and trains a different model. Here each kept/dropped
decision is a pure function of

``(seed, global sample index, offset of the token in its sample, global layer, site[, hidden
unit | global head, key offset])``

hashed with 32-bit integer mixing done in torch ``int64`` ops (every product stays below
2**63, so CPU and GPU give the same bits), turned into a uniform number in ``[0, 2**32)``
and kept when it is at least ``p * 2**32``. The sample index and offset of every position
come from the data pipeline (:attr:`odc_pp.data.microbatch.Microbatch.global_token_ids`),
so the same token of the same sample gets the same mask whichever microbatch, replica,
stage, tensor-parallel rank (sequence-parallel shards and head partitions are keyed by
their global indices) or iteration order runs it. Recomputation (``recompute_lgd``, full
recompute) reproduces the mask from the keys, not from a saved RNG state.

Sites (:data:`SITES`): the embedding's dropout, the attention-probability dropout
(``[batch, heads, query, key]``, keyed by the global head and the key's offset), and the
hidden dropout of the two bias-dropout-adds (after attention, after the MLP). They enter
megatron-core through the layer's ModuleSpec (:func:`keyed_layer_spec`): the layer class
(:class:`KeyedTransformerLayer`, which names its global layer for the sites inside it),
the core attention's dropout module and the two ``*_bda`` functions; the embedding's
``embedding_dropout`` submodule is a :class:`KeyedDropout` (:func:`use_keyed_embedding_dropout`).

A chunk's forward runs inside :func:`dropout_scope`, which holds the seed, this
microbatch's ``global_token_ids`` and the tensor-parallel rank; :func:`current_scope`
lets a recompute capture it and restore it in backward.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace

import torch

__all__ = ["SITES", "TOKEN_ID_BITS", "KEYED_ATTENTION", "DropoutScope", "AttentionKeys",
           "attention_keys", "dropout_scope", "current_scope", "restored_scope",
           "microbatch_scope", "mix32", "site_key", "keep_mask", "keyed_dropout", "KeyedDropout",
           "KeyedAttentionDropout", "KeyedTransformerLayer",
           "get_keyed_bias_dropout_add", "keyed_layer_spec", "use_keyed_embedding_dropout"]

M32 = 0xFFFFFFFF
TOKEN_ID_BITS = 32
"""``global_token_ids = sample index << 32 | offset in the sample``."""
_GOLDEN = 0x9E3779B9
_MULT = 0x045D9F3B  # < 2**31: a product with a 32-bit value stays below 2**63

SITES = {"embedding": 1, "attention": 2, "attention_output": 3, "mlp_output": 4}
"""Site ids mixed into the key: the embedding's dropout, the attention probabilities, the
hidden dropout after attention and after the MLP."""


def mix32(x):
    """A 32-bit integer hash (xor-shift-multiply) of ``x`` in ``[0, 2**32)``: a Python int or
    an int64 tensor (elementwise, a new tensor); the same bits on every device."""
    if isinstance(x, torch.Tensor):
        return _mix32_(x.clone())
    x = ((x ^ (x >> 16)) * _MULT) & M32
    x = ((x ^ (x >> 16)) * _MULT) & M32
    return x ^ (x >> 16)


def _mix32_(x: torch.Tensor) -> torch.Tensor:
    """:func:`mix32` of an int64 tensor in place (fewer full-size temporaries)."""
    for _ in range(2):
        x ^= x >> 16
        x *= _MULT
        x &= M32
    x ^= x >> 16
    return x


def site_key(seed: int, layer: int, site: str) -> int:
    """The 32-bit key of one dropout site of one (global) layer; layer -1: the embedding."""
    key = mix32((seed & M32) ^ _GOLDEN)
    key = mix32(key ^ ((seed >> 32) & M32))
    key = mix32(key ^ (layer & M32))
    return mix32(key ^ SITES[site])


def _token_keys(token_ids: torch.Tensor, key: int) -> torch.Tensor:
    """``[batch, seq]`` keys of (site key, sample index, offset in the sample)."""
    sample = (token_ids >> TOKEN_ID_BITS) & M32
    offset = token_ids & M32
    return mix32(mix32(mix32(sample ^ key) ^ _GOLDEN) ^ offset)


def _threshold(prob: float) -> int:
    return min(int(round(prob * 2.0 ** 32)), 2 ** 32)


def keep_mask(row_keys: torch.Tensor, column_keys: torch.Tensor, prob: float) -> torch.Tensor:
    """Bool keep mask: ``mix32(row ^ column) >= p * 2**32`` (broadcast)."""
    return _mix32_(row_keys ^ column_keys) >= _threshold(prob)


def _columns(count: int, device, start: int = 0) -> torch.Tensor:
    """Keys of unit indices ``start .. start + count - 1`` (hidden units, heads)."""
    index = torch.arange(start, start + count, dtype=torch.int64, device=device)
    return mix32(index ^ 0x632BE5AB)


class _MaskedScale(torch.autograd.Function):
    """``x * keep / (1 - p)`` saving the bool mask (1 byte per element) for backward."""

    @staticmethod
    def forward(ctx, x, keep, scale):
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return (x * keep).mul_(scale)

    @staticmethod
    def backward(ctx, grad_output):
        (keep,) = ctx.saved_tensors
        return (grad_output * keep).mul_(ctx.scale), None, None


def keyed_dropout(x: torch.Tensor, keep: torch.Tensor, prob: float) -> torch.Tensor:
    """Dropout of ``x`` with a given keep mask, scaled by ``1 / (1 - p)``."""
    return _MaskedScale.apply(x, keep, 1.0 / (1.0 - prob))


@dataclass(frozen=True, kw_only=True)
class DropoutScope:
    """What the keyed sites of one chunk forward need besides their own position."""

    seed: int
    """The run's seed (--seed)."""
    token_ids: torch.Tensor | None
    """This microbatch's ``[batch, seq]`` global token ids on the model's device (this
    context-parallel rank's positions); None: not given (dropout then refuses)."""
    tp_rank: int = 0
    """Tensor-parallel rank: sequence-parallel shards and head partitions start here."""
    tp_size: int = 1
    """Tensor-parallel size."""
    full_token_ids: torch.Tensor | None = None
    """Context parallelism: the whole rows' ``[batch, seq]`` global token ids (the keys
    that other ranks' chunks of the sequence hold); None: ``token_ids`` is the whole row."""
    layer: int = -1
    """Global layer running now; -1: the embedding."""

    def tokens(self, what: str) -> torch.Tensor:
        if self.token_ids is None:
            raise ValueError(f"{what} with dropout > 0 needs the microbatch's "
                             "global_token_ids (sample index << 32 | offset in the sample; "
                             "odc_pp.data.collate/pack(..., sample_ids=)) so that its masks "
                             "are the same in every layout; or set --hidden-dropout 0 "
                             "--attention-dropout 0")
        return self.token_ids

    def sequence_keys(self, site: str, seq: int) -> torch.Tensor:
        """``[seq, batch, 1]`` token keys of the positions an activation of ``seq``
        positions holds: all of them, or this rank's sequence-parallel shard."""
        keys = _token_keys(self.tokens(f"the {site} dropout"),
                           site_key(self.seed, self.layer, site)).transpose(0, 1)
        full = keys.shape[0]
        if seq != full:
            if seq * self.tp_size != full:
                raise ValueError(f"{site} dropout: an activation of {seq} positions is "
                                 f"neither the microbatch's {full} nor its "
                                 f"sequence-parallel shard ({full} / tp {self.tp_size})")
            keys = keys[self.tp_rank * seq:(self.tp_rank + 1) * seq]
        return keys.unsqueeze(-1)


_SCOPE: DropoutScope | None = None


def current_scope() -> DropoutScope | None:
    """The scope of the chunk forward running now (None outside one)."""
    return _SCOPE


@contextlib.contextmanager
def restored_scope(scope: DropoutScope | None):
    """Run with ``scope`` as the current one (a recompute's saved scope), then put back."""
    global _SCOPE
    previous, _SCOPE = _SCOPE, scope
    try:
        yield scope
    finally:
        _SCOPE = previous


def dropout_scope(*, seed: int, token_ids: torch.Tensor | None, tp_rank: int = 0,
                  tp_size: int = 1, full_token_ids: torch.Tensor | None = None):
    """Context of one chunk forward (see :class:`DropoutScope`)."""
    return restored_scope(DropoutScope(seed=seed, token_ids=token_ids, tp_rank=tp_rank,
                                       tp_size=tp_size, full_token_ids=full_token_ids))


def microbatch_scope(microbatch, *, seed: int, device, tensor_parallel=None):
    """:func:`dropout_scope` of a chunk forward on ``microbatch`` (its ``global_token_ids``
    moved to ``device``) under ``tensor_parallel`` (an
    :class:`~odc_pp.megatron.tp.TensorParallel`; None: tp = 1)."""
    ids, full = (getattr(microbatch, name, None)
                 for name in ("global_token_ids", "full_global_token_ids"))
    ids, full = (None if t is None else t.to(device, non_blocking=True) for t in (ids, full))
    rank, size = (0, 1) if tensor_parallel is None else \
        (tensor_parallel.rank, tensor_parallel.size)
    return dropout_scope(seed=seed, token_ids=ids, tp_rank=rank, tp_size=size,
                         full_token_ids=full)


def _scope(what: str) -> DropoutScope:
    if _SCOPE is None:
        raise RuntimeError(f"{what} dropout ran outside a chunk forward (dropout_scope)")
    return _SCOPE


class KeyedDropout(torch.nn.Module):
    """``torch.nn.Dropout(p)`` on a ``[seq, batch, hidden]`` activation with the keyed mask
    of ``site`` (in the current layer; the embedding: layer -1)."""

    def __init__(self, p: float, site: str = "embedding") -> None:
        super().__init__()
        self.p, self.site = float(p), site

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if self.p >= 1.0:
            return x * 0.0
        keys = _scope(self.site).sequence_keys(self.site, x.shape[0])
        keep = keep_mask(keys, _columns(x.shape[-1], x.device), self.p)
        return keyed_dropout(x, keep, self.p)


@dataclass(frozen=True, kw_only=True)
class AttentionKeys:
    """The keyed mask of one attention-probability dropout: ``keep(q, k)`` for any block
    of queries and keys, so a context-parallel attention can key the blocks it computes
    one by one."""

    prob: float
    """Dropout probability."""
    rows: torch.Tensor
    """``[batch, heads, queries]`` keys of (query token, global head)."""
    columns: torch.Tensor
    """``[batch, keys]`` keys of the key tokens' offsets in their samples."""

    @classmethod
    def of(cls, prob: float, queries: torch.Tensor, keys: torch.Tensor, heads: int,
           first_head: int) -> "AttentionKeys":
        """Keys of queries / key tokens with global token ids ``queries`` / ``keys``
        (``[batch, n]``) and heads ``first_head ..`` of the current layer."""
        scope = _scope("attention")
        rows = _token_keys(queries, site_key(scope.seed, scope.layer, "attention"))
        head_keys = _columns(heads, queries.device, start=first_head)
        return cls(prob=prob, rows=mix32(rows[:, None, :] ^ head_keys[None, :, None]),
                   columns=mix32((keys & M32) ^ 0x2545F491))

    @property
    def scale(self) -> float:
        return 1.0 / (1.0 - self.prob)

    def keep(self, queries: slice = slice(None), keys: slice = slice(None)) -> torch.Tensor:
        """Bool ``[batch, heads, q, k]`` keep mask of a block."""
        return keep_mask(self.rows[:, :, queries, None], self.columns[:, None, None, keys],
                         self.prob)


def attention_keys(prob: float, heads: int, *, cp_rank: int = 0, cp_size: int = 1,
                   order: torch.Tensor | None = None) -> AttentionKeys:
    """:class:`AttentionKeys` of the current scope: this rank's query tokens and heads
    (``heads`` per rank: tensor-parallel partitions, then ``cp_size`` all-to-all ranks
    each holding ``heads / cp_size``; ``cp_rank`` names this one) against the whole
    rows' key tokens. ``order``: queries and keys are the whole rows' tokens in this
    order (the all-to-all attention's gathered sequence)."""
    scope = _scope("attention")
    local = scope.tokens("attention dropout")
    full = scope.full_token_ids if scope.full_token_ids is not None else local
    first = (scope.tp_rank * cp_size + cp_rank) * heads
    if order is not None:
        local = full = full[:, order.to(full.device)]
    return AttentionKeys.of(prob, local, full, heads, first)


class KeyedAttentionDropout(torch.nn.Module):
    """Dropout of attention probabilities ``[batch, heads, query, key]`` keyed by the
    query token, the global head (this tensor-parallel rank's heads follow the ranks
    before it) and the key's offset in its sample."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = float(p)

    def forward(self, probs: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return probs
        keys = attention_keys(self.p, probs.shape[1])
        if keys.rows.shape[2] != probs.shape[2] or keys.columns.shape[1] != probs.shape[3]:
            raise ValueError(f"attention dropout: a [{probs.shape[2]} x {probs.shape[3]}] "
                             f"score block is not the microbatch's "
                             f"{keys.rows.shape[2]} positions")
        return keyed_dropout(probs, keys.keep(), self.p)


class _RecomputedKeyedAdd(torch.autograd.Function):
    """``residual + dropout(x + bias)`` saving only the token keys: backward recomputes
    the mask from them (``recompute_lgd``)."""

    @staticmethod
    def forward(ctx, x, bias, residual, keys, prob):
        kept = x + bias if bias is not None else x
        keep = keep_mask(keys, _columns(x.shape[-1], x.device), prob)
        ctx.save_for_backward(keys)
        ctx.prob, ctx.width = prob, x.shape[-1]
        ctx.bias_shape = bias.shape if bias is not None else None
        return residual + kept * keep.to(kept.dtype) * (1.0 / (1.0 - prob))

    @staticmethod
    def backward(ctx, grad_output):
        (keys,) = ctx.saved_tensors
        keep = keep_mask(keys, _columns(ctx.width, grad_output.device), ctx.prob)
        grad_kept = grad_output * keep.to(grad_output.dtype) * (1.0 / (1.0 - ctx.prob))
        grad_bias = None if ctx.bias_shape is None else grad_kept.sum_to_size(ctx.bias_shape)
        return grad_kept, grad_bias, grad_output, None, None


def get_keyed_bias_dropout_add(site: str, *, recompute: bool = False):
    """A spec ``self_attn_bda`` / ``mlp_bda`` (megatron's ``get_bias_dropout_add``
    signature ``(training, fused)``): ``residual + dropout(x + bias)`` with the keyed
    mask of ``site`` (``attention_output`` or ``mlp_output``) in the current layer.
    ``recompute``: the mask is not saved but recomputed in backward from the token keys
    (``recompute_lgd``). ``fused`` is ignored (no jit fusion). Without dropout (eval,
    p = 0) or at p >= 1 it is megatron's unfused function."""
    from .compat import unfused_bias_dropout_add

    def get(training: bool, fused: bool):
        def bias_dropout_add(x_with_bias, residual, prob):
            x, bias = x_with_bias
            if not training or not 0.0 < prob < 1.0:
                return unfused_bias_dropout_add(x_with_bias, residual, prob, training)
            residual = residual if residual.dtype == x.dtype else residual.to(x.dtype)
            keys = _scope(site).sequence_keys(site, x.shape[0])
            if recompute:
                return _RecomputedKeyedAdd.apply(x, bias, residual, keys, prob)
            kept = x + bias if bias is not None else x
            keep = keep_mask(keys, _columns(x.shape[-1], x.device), prob)
            return residual + keyed_dropout(kept, keep, prob)

        return bias_dropout_add

    return get


def _transformer_layer():
    from megatron.core.transformer.transformer_layer import TransformerLayer

    return TransformerLayer


class KeyedTransformerLayer(_transformer_layer()):
    """megatron's ``TransformerLayer`` whose forward names its global layer
    (``global_layer``, set by the chunk builder) to the keyed dropout sites inside it."""

    global_layer: int | None = None
    """Index of this layer in the whole model (not the chunk)."""

    def forward(self, *args, **kwargs):
        scope = current_scope()
        if scope is None:
            return super().forward(*args, **kwargs)
        if self.global_layer is None:
            raise RuntimeError("KeyedTransformerLayer.global_layer is not set (the chunk "
                               "builder numbers the layers)")
        with restored_scope(replace(scope, layer=self.global_layer)):
            return super().forward(*args, **kwargs)


class _KeyedAttentionMixin:
    """A core attention whose probability dropout is :class:`KeyedAttentionDropout`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.attention_dropout = KeyedAttentionDropout(self.config.attention_dropout)


def _attention_classes():
    from .compat import HostDotProductAttention, SdpaDotProductAttention, causal_mask
    from .rope_triton import RotaryInAttention

    class KeyedHostAttention(_KeyedAttentionMixin, HostDotProductAttention):
        """:class:`~odc_pp.megatron.compat.HostDotProductAttention` with keyed dropout."""

    class KeyedSdpaAttention(_KeyedAttentionMixin, SdpaDotProductAttention):
        """:class:`~odc_pp.megatron.compat.SdpaDotProductAttention`; while training with
        attention dropout it computes the probabilities explicitly (the host math) to
        apply the keyed mask, which no fused kernel takes."""

        def forward(self, query, key, value, attention_mask, attn_mask_type=None,
                    attention_bias=None, packed_seq_params=None):
            if not (self.training and self.attention_dropout.p > 0):
                return super().forward(query, key, value, attention_mask, attn_mask_type,
                                       attention_bias, packed_seq_params)
            if isinstance(attention_mask, RotaryInAttention):  # --fused-rope
                query, key = attention_mask.apply(query, key)
                attention_mask = attention_mask.mask
            if attention_mask is None:
                attention_mask = causal_mask(query.shape[0], query.device)
            return HostDotProductAttention.forward(self, query, key, value, attention_mask,
                                                   attn_mask_type, attention_bias,
                                                   packed_seq_params)

    return {HostDotProductAttention: KeyedHostAttention,
            SdpaDotProductAttention: KeyedSdpaAttention}


KEYED_ATTENTION = _attention_classes()
"""Core attention class -> its keyed-dropout subclass."""


def keyed_layer_spec(spec, *, recompute: bool = False):
    """Switch a local layer spec (in place) to the keyed dropout sites: the layer class,
    the two bias-dropout-adds (``recompute``: masks recomputed in backward) and the core
    attention's dropout (the host and SDPA attentions; the context-parallel one has no
    attention dropout). Returns ``spec``."""
    spec.module = KeyedTransformerLayer
    spec.submodules.self_attn_bda = get_keyed_bias_dropout_add("attention_output",
                                                               recompute=recompute)
    spec.submodules.mlp_bda = get_keyed_bias_dropout_add("mlp_output", recompute=recompute)
    attention = spec.submodules.self_attention.submodules
    if attention.core_attention in KEYED_ATTENTION:
        attention.core_attention = KEYED_ATTENTION[attention.core_attention]
    return spec


def use_keyed_embedding_dropout(model, first_layer: int) -> None:
    """Give a built megatron ``GPTModel`` chunk keyed dropout: its embedding's
    ``embedding_dropout`` (first stage) becomes a :class:`KeyedDropout` and its decoder
    layers (:class:`KeyedTransformerLayer`) learn their global index from
    ``first_layer``, the chunk's first layer in the whole model."""
    if getattr(model, "pre_process", False):
        model.embedding.embedding_dropout = KeyedDropout(model.config.hidden_dropout)
    for index, layer in enumerate(model.decoder.layers):
        if isinstance(layer, KeyedTransformerLayer):
            layer.global_layer = first_layer + index
