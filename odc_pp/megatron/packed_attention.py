"""Core attention of packed rows without an ``s x s`` mask (torch only, no megatron import).

A packed row (:func:`odc_pp.data.samples.pack`) holds several documents back to back;
``segment_ids`` number them (padding is -1). Query i sees key j iff both are in the same
document and ``j <= i``; a padding position sees itself only (the contract of
:class:`~odc_pp.data.microbatch.Microbatch`). The dense form of that rule is
:func:`packed_causal_mask`; the model hands the SDPA core attention a
:class:`PackedSegments` instead, and :func:`packed_attention` picks one of these kernels:

=========  ==========================================================================
varlen     flash attention over ``cu_seqlens`` (``torch.nn.attention.varlen.varlen_attn``,
           else ``flash_attn.flash_attn_varlen_func``): CUDA, bf16/fp16, no attention
           dropout, every document one contiguous run. Each padding position is a
           document of length 1, so every logit equals the dense path's.
flex       ``torch.nn.attention.flex_attention`` with the document mask as a ``BlockMask``
           (compiled on CUDA; fully masked blocks are skipped). CUDA in any dtype; on CPU
           forward only (torch has no CPU FlexAttention backward).
dense      ``scaled_dot_product_attention`` with the boolean ``[b, 1, s, s]`` mask (the
           pre-issue-21 path): the fallback for attention dropout and for CPU.
=========  ==========================================================================

``auto`` (:func:`resolve_kernel`) is varlen where it applies, else flex on CUDA, else
dense: a function of the device, dtype, dropout and the segment layout only, so every rank
of a group picks the same kernel. Grouped-query attention never expands K/V
(``enable_gqa``). On a torch whose ``varlen_attn`` predates ``enable_gqa`` and without
``flash_attn``, varlen calls the aten flash ops with the K/V heads as they are
(:mod:`odc_pp.megatron.varlen_gqa`, checked once per device); only where that check fails
are the K/V heads repeated for the call.
"""

from __future__ import annotations

import functools
import inspect
import math
import warnings

import torch

from ..data.pinned import to_device
from .varlen_gqa import aten_flash_ops, flash_varlen_gqa, gqa_flash_problem

__all__ = ["PACKED_KERNELS", "PackedSegments", "packed_causal_mask", "resolve_kernel",
           "packed_attention", "varlen_backend", "short_row_segments"]

PACKED_KERNELS = ("auto", "varlen", "flex", "dense")
"""Values of ``ModelConfig.packed_attention`` / ``--packed-attention``."""
_FLASH_DTYPES = (torch.bfloat16, torch.float16)


def packed_causal_mask(segment_ids: torch.Tensor) -> torch.Tensor:
    """Megatron's boolean convention (True: may NOT attend), ``[batch, 1, seq, seq]``, for
    packed rows (:class:`~odc_pp.data.microbatch.Microbatch` ``segment_ids``): query i
    sees key j iff both are in the same segment and ``j <= i``; a padding position
    (segment -1) sees itself only, so no softmax row is empty."""
    seq = segment_ids.shape[1]
    same = segment_ids.unsqueeze(2) == segment_ids.unsqueeze(1)
    causal = torch.ones(seq, seq, dtype=torch.bool, device=segment_ids.device).tril()
    allowed = (same & causal & (segment_ids >= 0).unsqueeze(2)) | \
        torch.eye(seq, dtype=torch.bool, device=segment_ids.device)
    return (~allowed).unsqueeze(1)


class PackedSegments:
    """The documents of packed rows, handed to the core attention in place of a mask.

    Built once per microbatch forward and shared by every layer: ``cu_seqlens`` (int32,
    on ``device``) over the rows flattened batch-major, one entry per contiguous run of a
    segment and one per padding position; ``max_seqlen``; whether every segment is one
    contiguous run of its row (``contiguous``; varlen needs it). Computed on the host
    from the host copy of ``segment_ids`` (no device synchronisation when the microbatch
    lives on the CPU, as the runtime keeps it). The dense mask and the FlexAttention
    block mask are built on first use and cached. ``kernel``: the requested kernel (a
    :data:`PACKED_KERNELS` value)."""

    def __init__(self, segment_ids: torch.Tensor, device: torch.device | str, *,
                 kernel: str = "auto") -> None:
        if kernel not in PACKED_KERNELS:
            raise ValueError(f"packed attention kernel must be one of {PACKED_KERNELS}, "
                             f"got {kernel!r}")
        if segment_ids.dim() != 2:
            raise ValueError(f"segment_ids must be [batch, seq], got "
                             f"{tuple(segment_ids.shape)}")
        host = segment_ids.detach().to("cpu", torch.int64)
        batch, seq = host.shape
        starts = torch.ones_like(host, dtype=torch.bool)
        starts[:, 1:] = (host[:, 1:] != host[:, :-1]) | (host[:, 1:] < 0)
        runs = starts & (host >= 0)
        segments = sum(int(torch.unique(row[row >= 0]).numel()) for row in host)
        offsets = torch.cat([starts.reshape(-1).nonzero().squeeze(1),
                             torch.tensor([batch * seq])])
        self.kernel = kernel
        self.shape = (batch, seq)
        self.contiguous = int(runs.sum()) == segments
        self.max_seqlen = int((offsets[1:] - offsets[:-1]).max()) if seq else 0
        self.segment_ids = to_device(segment_ids, device)
        self.cu_seqlens = to_device(offsets.to(torch.int32), device)
        self._dense: torch.Tensor | None = None
        self._block_mask = None

    def dense_mask(self) -> torch.Tensor:
        """:func:`packed_causal_mask` of the rows (cached)."""
        if self._dense is None:
            self._dense = packed_causal_mask(self.segment_ids)
        return self._dense

    def block_mask(self):
        """The document mask as a FlexAttention ``BlockMask`` (cached)."""
        if self._block_mask is None:
            from torch.nn.attention.flex_attention import create_block_mask

            ids = self.segment_ids

            def document_causal(b, h, q, k):
                same = (ids[b, q] == ids[b, k]) & (ids[b, q] >= 0) & (k <= q)
                return same | (q == k)

            batch, seq = self.shape
            self._block_mask = create_block_mask(document_causal, batch, None, seq, seq,
                                                 device=ids.device)
        return self._block_mask


FLEX_MIN_HEAD_DIM = 16
"""Inductor's flex attention (compiled on CUDA) refuses smaller head dimensions; the eager
CPU forward takes any."""
FLASH_MAX_HEAD_DIM = 256
"""Flash kernels take head dimensions that are multiples of 8, up to this."""


def resolve_kernel(request: str, *, device: torch.device | str, dtype: torch.dtype,
                   dropout: float, contiguous: bool = True, needs_grad: bool = False,
                   head_dim: int | None = None) -> str:
    """The kernel that runs (``varlen``, ``flex`` or ``dense``) for a request of
    :data:`PACKED_KERNELS`; a request that cannot run here is one ValueError naming why.
    ``auto`` never picks a kernel that cannot run the shape: flex needs a head dimension
    of at least :data:`FLEX_MIN_HEAD_DIM`, varlen a multiple of 8 up to
    :data:`FLASH_MAX_HEAD_DIM` (None: not known, assumed to fit)."""
    cuda = torch.device(device).type == "cuda"
    flash_dim = head_dim is None or (head_dim % 8 == 0 and head_dim <= FLASH_MAX_HEAD_DIM)
    flex_dim = not cuda or head_dim is None or head_dim >= FLEX_MIN_HEAD_DIM  # compiled on CUDA
    varlen_ok = cuda and dtype in _FLASH_DTYPES and dropout == 0.0 and contiguous and \
        flash_dim and varlen_backend(1) is not None
    if request == "auto":
        return "varlen" if varlen_ok else \
            "flex" if cuda and dropout == 0.0 and flex_dim else "dense"
    if request == "varlen" and not varlen_ok:
        raise ValueError(
            f"--packed-attention varlen needs CUDA, bf16/fp16, no attention dropout, "
            f"contiguous segments and torch.nn.attention.varlen or flash_attn (here: device "
            f"{torch.device(device)}, {dtype}, dropout {dropout}, contiguous {contiguous}, "
            f"head dim {head_dim} (a multiple of 8, <= {FLASH_MAX_HEAD_DIM}), "
            f"varlen {'found' if varlen_backend(1) else 'missing'}); use auto or dense")
    if request == "flex" and (dropout > 0.0 or (not cuda and needs_grad)):
        raise ValueError("--packed-attention flex has no attention dropout and no CPU "
                         "backward; use auto or dense")
    if request == "flex" and not flex_dim:
        raise ValueError(f"--packed-attention flex needs a head dimension >= "
                         f"{FLEX_MIN_HEAD_DIM} (here {head_dim}); use auto or dense")
    return request


def short_row_segments(batch: int, seq: int, device: torch.device | str, *, full_length: int,
                       dtype: torch.dtype, dropout: float,
                       head_dim: int | None) -> PackedSegments | None:
    """Unpacked rows shorter than ``full_length`` (variable-length samples, each row one
    document, causal) as :class:`PackedSegments` of one segment per row for the varlen
    kernel, when ``auto`` picks varlen here; None otherwise (``is_causal`` SDPA).

    Why: on sm90 with cuDNN >= 9.15 torch (2.10+) prefers cuDNN's SDPA, which builds an
    execution plan per new sequence length; unpacked variable-length rows give nearly every
    microbatch a new length. Flash varlen takes the length as data (``cu_seqlens``), so
    no per-shape work. Full-length rows (one shape) keep SDPA. Right padding of a shorter
    sample in a row with ``micro_batch_size > 1`` stays inside the row's one segment: it
    comes after the sample's tokens, so causal attention of those tokens is unchanged (the
    padding carries no loss), the same as ``is_causal``."""
    if seq >= full_length or resolve_kernel("auto", device=device, dtype=dtype,
                                            dropout=dropout, head_dim=head_dim) != "varlen":
        return None
    return PackedSegments(torch.zeros(batch, seq, dtype=torch.int64), device, kernel="varlen")


@functools.lru_cache(maxsize=None)
def varlen_backend(groups: int):
    """``(name, fn)`` with ``fn(q, k, v, cu_seqlens, max_seqlen, scale)`` -> causal
    per-document attention of ``[tokens, heads, dim]`` inputs, or None when neither
    torch's ``varlen_attn`` nor ``flash_attn`` is importable. Prefers torch's when it
    takes ``enable_gqa`` (or ``groups`` is 1), then ``flash_attn``, then the aten flash ops
    with GQA K/V (falling back per device to repeated heads where their check fails),
    then torch's with the K/V heads repeated."""
    try:
        from torch.nn.attention.varlen import varlen_attn
        params = inspect.signature(varlen_attn).parameters
    except (ImportError, AttributeError):
        varlen_attn, params = None, {}
    if varlen_attn is not None and (groups == 1 or "enable_gqa" in params):
        return "torch.varlen_attn", functools.partial(_torch_varlen, varlen_attn, params)
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        flash_attn_varlen_func = None
    if flash_attn_varlen_func is not None:
        return "flash_attn", functools.partial(_flash_attn_varlen, flash_attn_varlen_func)
    if varlen_attn is not None and aten_flash_ops() is not None:
        return "aten.flash_varlen_gqa", functools.partial(_gqa_or_repeated, varlen_attn, params)
    if varlen_attn is not None:
        return "torch.varlen_attn+repeat_kv", functools.partial(_torch_varlen, varlen_attn,
                                                                params)
    return None


def _gqa_or_repeated(varlen_attn, params, q, k, v, cu_seqlens, max_seqlen, scale):
    """GQA-native flash (:mod:`odc_pp.megatron.varlen_gqa`) where its once-per-device check
    passed, else torch's ``varlen_attn`` with the K/V heads repeated (warned once)."""
    problem = gqa_flash_problem(str(q.device))
    if problem is None:
        return flash_varlen_gqa(q, k, v, cu_seqlens, max_seqlen, scale)
    warnings.warn(f"packed attention repeats the K/V heads: {problem}", stacklevel=2)
    return _torch_varlen(varlen_attn, params, q, k, v, cu_seqlens, max_seqlen, scale)


def _torch_varlen(varlen_attn, params, q, k, v, cu_seqlens, max_seqlen, scale):
    kwargs = {}
    if "window_size" in params:
        kwargs["window_size"] = (-1, 0)  # causal
    else:
        kwargs["is_causal"] = True
    if "scale" in params:
        kwargs["scale"] = scale
    else:  # the kernel scales by 1/sqrt(dim)
        q = q * (scale * math.sqrt(q.shape[-1]))
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        if "enable_gqa" in params:
            kwargs["enable_gqa"] = True
        else:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, **kwargs)


def _flash_attn_varlen(fn, q, k, v, cu_seqlens, max_seqlen, scale):
    return fn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p=0.0,
              softmax_scale=scale, causal=True)


@functools.lru_cache(maxsize=None)
def _flex(device_type: str):
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention) if device_type == "cuda" else flex_attention


def packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     segments: PackedSegments, *, scale: float, dropout: float = 0.0,
                     kernel: str | None = None, varlen=None) -> torch.Tensor:
    """Attention of ``[b, heads, s, d]`` queries over ``[b, groups, s, d]`` keys/values
    within the documents of ``segments``; returns ``[b, heads, s, d]``. ``kernel``: one of
    varlen/flex/dense (default: :func:`resolve_kernel` of ``segments.kernel``);
    ``varlen``: the varlen function to call (default :func:`varlen_backend`'s)."""
    if kernel is None:
        kernel = resolve_kernel(segments.kernel, device=q.device, dtype=q.dtype,
                                dropout=dropout, contiguous=segments.contiguous,
                                needs_grad=q.requires_grad, head_dim=q.shape[-1])
    batch, heads, seq, dim = q.shape
    if kernel == "varlen":
        if varlen is None:
            found = varlen_backend(heads // k.shape[1])
            if found is None:
                raise ValueError("no varlen attention kernel (torch.nn.attention.varlen "
                                 "or flash_attn)")
            varlen = found[1]
        # [b, n, s, d] -> [b*s, n, d] (a view for b = 1); V is a strided slice of
        # megatron's fused qkv: the flash kernels take dense token-major inputs
        tokens = (t.transpose(1, 2).reshape(batch * seq, t.shape[1], dim).contiguous()
                  for t in (q, k, v))
        out = varlen(*tokens, segments.cu_seqlens, segments.max_seqlen, scale)
        return out.view(batch, seq, heads, dim).transpose(1, 2)
    if kernel == "flex":
        return _flex(q.device.type)(q, k, v, block_mask=segments.block_mask(), scale=scale,
                                    enable_gqa=heads != k.shape[1])
    if kernel == "dense":
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=~segments.dense_mask(), dropout_p=dropout, scale=scale,
            enable_gqa=heads != k.shape[1])
    raise ValueError(f"unknown packed attention kernel {kernel!r}")
