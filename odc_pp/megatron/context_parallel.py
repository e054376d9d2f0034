"""Context parallelism's core: the load-balanced sequence split, each rank's view of
packed documents, RoPE positions, and a core attention over a CP group.

Training reaches it through ``--context-parallel-size`` (the topology in
:mod:`odc_pp.training.distributed`, the split in :mod:`odc_pp.training.context_split`);
see docs/context_parallel.md.

Layout (Megatron's causal load balance). A sequence of ``s`` tokens is cut into ``2N``
chunks of ``s / 2N`` tokens; rank ``i`` of the ``N`` CP ranks holds chunks ``i`` and
``2N - 1 - i``, in that order (:func:`cp_token_indices`, :func:`cp_split`;
:func:`cp_unsplit` is the inverse). Under a causal mask the early chunk sees little and
the late chunk much, so every rank does the same work.

Packed rows. Documents are cut with the row (a document may cross chunk and rank
boundaries); every rank keeps the full row's segment ids (from the document lengths,
:func:`segment_ids_from_lengths`), so each rank derives, without communication, what its
query chunks may see of every other rank's key chunks (:func:`cp_block_plan`) and its
local document runs (:func:`cp_local_cu_seqlens`). RoPE: the positions (``0..s-1``, or
restarting per document under reset-position-ids semantics) are split with the same
layout (:func:`cp_position_ids`), so each token keeps its global rotary angle.

Attention: ring attention (:func:`ring_attention`, below) or all-to-all
(:func:`ulysses_attention`) over an explicit group;
:class:`~odc_pp.megatron.cp_attention.ContextParallelDotProductAttention` puts megatron's
``DotProductAttention`` interface on it (the group from ``pg_collection.cp``, as
megatron's ``TEDotProductAttention`` takes it, or an explicit ``cp_group``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["CP_COMM_TYPES", "cp_token_indices", "cp_split", "cp_unsplit", "cp_position_ids",
           "segment_ids_from_lengths", "cp_block_plan", "cp_local_cu_seqlens",
           "pair_mask", "ring_comm_plan", "RingAttention", "ring_attention",
           "ulysses_attention", "LocalRows"]

CP_COMM_TYPES = ("p2p", "a2a")
"""Values of ``cp_comm_type`` the core attention implements (Megatron's meaning)."""


def _check_layout(seq: int, rank: int, size: int) -> int:
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"context-parallel rank {rank} of size {size} is not valid")
    if seq % (2 * size):
        raise ValueError(f"--context-parallel-size {size} needs a sequence length divisible "
                         f"by {2 * size} (2 x CP), got {seq}")
    return seq // (2 * size)


def cp_token_indices(seq: int, rank: int, size: int) -> torch.Tensor:
    """The global token positions rank ``rank`` of ``size`` holds, in its local order:
    chunk ``rank`` then chunk ``2 * size - 1 - rank`` of ``2 * size``."""
    chunk = _check_layout(seq, rank, size)
    late = 2 * size - 1 - rank
    return torch.cat([torch.arange(rank * chunk, (rank + 1) * chunk),
                      torch.arange(late * chunk, (late + 1) * chunk)])


def cp_split(tensor: torch.Tensor, rank: int, size: int, *, dim: int = 0) -> torch.Tensor:
    """This rank's tokens of ``tensor`` along ``dim`` (0 for megatron's ``[s, b, ...]``,
    1 for ``[b, s]`` tokens / labels / position ids)."""
    index = cp_token_indices(tensor.shape[dim], rank, size).to(tensor.device)
    return tensor.index_select(dim, index)


def cp_unsplit(parts: list[torch.Tensor], *, dim: int = 0) -> torch.Tensor:
    """The inverse of :func:`cp_split`: ``parts[i]`` is rank ``i``'s local tensor (e.g.
    from an all-gather); returns the tensor in global token order."""
    size = len(parts)
    if size == 0:
        raise ValueError("cp_unsplit needs one part per context-parallel rank")
    local = parts[0].shape[dim]
    if local % 2 or any(p.shape[dim] != local for p in parts):
        raise ValueError(f"every part must hold two equal chunks along dim {dim}, got "
                         f"{[p.shape[dim] for p in parts]}")
    chunk = local // 2
    ordered = [None] * (2 * size)
    for rank, part in enumerate(parts):
        early, late = part.split(chunk, dim=dim)
        ordered[rank], ordered[2 * size - 1 - rank] = early, late
    return torch.cat(ordered, dim=dim)


def cp_position_ids(position_ids: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """This rank's RoPE positions: the ``[b, s]`` global ``position_ids`` (``0..s-1``, or
    restarting per document when position ids are reset) split with the CP layout, so
    every token keeps the rotary angle it has without CP."""
    if position_ids.dim() != 2:
        raise ValueError(f"position_ids must be [batch, seq], got "
                         f"{tuple(position_ids.shape)}")
    return cp_split(position_ids, rank, size, dim=1)


def segment_ids_from_lengths(lengths: list[list[int]], seq: int) -> torch.Tensor:
    """``[b, seq]`` document ids of packed rows from each row's document lengths (in
    order; the rest of the row is padding, -1)."""
    rows = []
    for row in lengths:
        if any(n <= 0 for n in row) or sum(row) > seq:
            raise ValueError(f"document lengths {row} must be positive and fit in {seq} "
                             f"tokens")
        ids = [doc for doc, n in enumerate(row) for _ in range(n)]
        rows.append(ids + [-1] * (seq - len(ids)))
    return torch.tensor(rows, dtype=torch.int64)


def cp_block_plan(segment_ids: torch.Tensor | None, seq: int, rank: int,
                  size: int) -> list[dict[tuple[int, int], str]]:
    """What rank ``rank``'s query chunks attend to in each ring step: entry ``t`` maps
    ``(query half, key half)`` of this rank against rank ``(rank - t) mod size``'s K/V to
    ``"all"`` (no mask) or ``"masked"``; missing pairs are skipped. Deterministic and
    computed from the (full-row) segment ids or, for None, causality alone."""
    chunk = _check_layout(seq, rank, size)
    plan = []
    for step in range(size):
        src = (rank - step) % size
        entry = {}
        for qa, q_chunk in enumerate((rank, 2 * size - 1 - rank)):
            for kb, k_chunk in enumerate((src, 2 * size - 1 - src)):
                mask = pair_mask(q_chunk, k_chunk, chunk, segment_ids)
                if isinstance(mask, str) and mask == "none":
                    continue
                entry[(qa, kb)] = mask if isinstance(mask, str) else "masked"
        plan.append(entry)
    return plan


def cp_local_cu_seqlens(segment_ids: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """int32 ``cu_seqlens`` of this rank's local tokens (rows flattened batch-major, local
    order): one run per contiguous piece of a document, a new run at the boundary between
    the two chunks, one per padding position (as
    :class:`~odc_pp.megatron.packed_attention.PackedSegments` counts them)."""
    local = cp_split(segment_ids, rank, size, dim=1)
    starts = torch.ones_like(local, dtype=torch.bool)
    starts[:, 1:] = (local[:, 1:] != local[:, :-1]) | (local[:, 1:] < 0)
    starts[:, local.shape[1] // 2] = True
    offsets = starts.reshape(-1).nonzero().squeeze(1)
    return torch.cat([offsets, torch.tensor([local.numel()])]).to(torch.int32)


# ---- ring attention (Megatron's p2p cp_comm_type) ----------------------------------
#
# Over a context-parallel group.
#
# :class:`RingAttention` is a ``torch.autograd.Function`` over an explicit process group.
# Every rank holds the queries, keys and values of its two load-balanced chunks
# (above). Forward: N steps; in step t rank r holds the
# K/V of rank ``(r - t) mod N``, posts the transfer of that block to rank r+1 (and the
# receive of the next one from r-1) with ``batch_isend_irecv`` *before* computing on it,
# attends its queries to it chunk pair by chunk pair (a pair whose mask is empty is skipped:
# the causal balance makes half of the pairs of every step after the first empty) and merges
# the partial results by log-sum-exp in fp32. Backward: the same ring; the gradient of each
# K/V block travels with it, each rank adding its share (dK/dV are summed on the way and
# arrive at their owner after one last hop), while dQ stays local. Attention has no weights,
# so all of this is input gradient (the schedule's B); nothing is left for W.
#
# Every rank posts the same batch (sends before receives, K/V before dK/dV) to the same two
# neighbours in the same order at every step, so the pattern is safe under NCCL's ordering
# (one communicator, FIFO, rendezvous sends) as well as on gloo.

_TAGS = {"kv": 3201, "dkv": 3202}


def pair_mask(q_chunk: int, k_chunk: int, chunk: int, segment_ids: torch.Tensor | None,
              device: torch.device | str = "cpu"):
    """What queries of global chunk ``q_chunk`` may see of keys of global chunk
    ``k_chunk`` (chunks of ``chunk`` tokens): ``"none"`` (skip the pair), ``"all"`` (no
    mask needed) or a boolean ``[b, 1, 1, chunk, chunk]`` tensor (True: may attend).
    Causal; with ``segment_ids`` (``[b, seq]`` of the full row, -1 for padding) also
    within one document, a padding position seeing itself only (as
    :func:`~odc_pp.megatron.packed_attention.packed_causal_mask`)."""
    if k_chunk > q_chunk:
        return "none"
    diagonal = k_chunk == q_chunk
    if segment_ids is None:
        if not diagonal:
            return "all"
        causal = torch.ones(chunk, chunk, dtype=torch.bool, device=device).tril()
        return causal[None, None, None]
    sq = segment_ids[:, q_chunk * chunk:(q_chunk + 1) * chunk]
    sk = segment_ids[:, k_chunk * chunk:(k_chunk + 1) * chunk]
    allowed = (sq.unsqueeze(2) == sk.unsqueeze(1)) & (sq >= 0).unsqueeze(2)
    if diagonal:
        eye = torch.eye(chunk, dtype=torch.bool, device=allowed.device)
        allowed = (allowed & torch.ones_like(eye).tril()) | eye
    if not bool(allowed.any()):
        return "none"
    if bool(allowed.all()):
        return "all"
    return allowed[:, None, None]


def _chunks(rank: int, size: int) -> tuple[int, int]:
    return rank, 2 * size - 1 - rank


def ring_comm_plan(rank: int, size: int, *, backward: bool = False
                   ) -> list[list[tuple[str, str, int]]]:
    """The batches :class:`RingAttention` posts on rank ``rank`` of ``size``, in order: one
    per step (backward: one more, the last hop of the complete dK/dV to its owner), each a
    list of ``(op, payload, group peer)`` with ``op`` ``send`` / ``recv`` and ``payload``
    ``kv`` / ``dkv``: K/V to rank+1 and from rank-1 while a next block remains, the dK/dV
    accumulator likewise one step behind, sends before receives, K/V before dK/dV."""
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    plan = []
    for step in range(size + 1 if backward and size > 1 else size):
        payloads = ["kv"] if step < size - 1 else []
        if backward and step > 0:
            payloads.append("dkv")
        plan.append([("send", p, nxt) for p in payloads] + [("recv", p, prv) for p in payloads])
    return plan


def _post(group, batch, buffers):
    """Post one batch of :func:`ring_comm_plan` with ``buffers[(op, payload)]``; returns
    the requests."""
    ops = [dist.P2POp(dist.isend if op == "send" else dist.irecv, buffers[(op, payload)],
                      dist.get_global_rank(group, peer), group, _TAGS[payload])
           for op, payload, peer in batch]
    return dist.batch_isend_irecv(ops) if ops else []


def _scores(q5, k, chunk, qa, kb, scale, mask):
    """fp32 scores ``[b, g, rep, c, c]`` of query half ``qa`` against key half ``kb``,
    masked with -inf."""
    qs = q5[..., qa * chunk:(qa + 1) * chunk, :]
    ks = k[..., kb * chunk:(kb + 1) * chunk, :].unsqueeze(2).float()
    scores = torch.matmul(qs, ks.transpose(-1, -2)) * scale
    if not isinstance(mask, str):
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores


def _finite(x: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isinf(x), torch.zeros_like(x), x)


def _block_dropout(dropout, src: int, size: int, chunk: int, shape5):
    """``(query half, key half) -> [b, g, rep, c, c]`` scaled keep mask of this rank's
    queries against rank ``src``'s keys (keyed attention dropout), or None."""
    if dropout is None:
        return None
    key_chunks = _chunks(src, size)

    def mask(qa: int, kb: int) -> torch.Tensor:
        keep = dropout.keep(slice(qa * chunk, (qa + 1) * chunk),
                            slice(key_chunks[kb] * chunk, (key_chunks[kb] + 1) * chunk))
        return (keep.float() * dropout.scale).reshape(tuple(shape5[:3]) + (chunk, chunk))

    return mask


def _forward_block(q5, kv, chunk, masks, out, lse, scale, drop=None):
    """Attend the local queries to one K/V block, merging into ``out`` / ``lse``
    (``drop``: :func:`_block_dropout`'s masks, applied to the normalised block)."""
    for (qa, kb), mask in masks.items():
        scores = _scores(q5, kv[0], chunk, qa, kb, scale, mask)
        block_lse = torch.logsumexp(scores, dim=-1)
        probs = torch.exp(scores - _finite(block_lse).unsqueeze(-1))
        if drop is not None:
            probs = probs * drop(qa, kb)
        block_out = torch.matmul(probs, kv[1][..., kb * chunk:(kb + 1) * chunk, :]
                                 .unsqueeze(2).float())
        rows = slice(qa * chunk, (qa + 1) * chunk)
        old_lse = lse[..., rows]
        new_lse = torch.logaddexp(old_lse, block_lse)
        safe = _finite(new_lse)
        out[..., rows, :] = out[..., rows, :] * torch.exp(old_lse - safe).unsqueeze(-1) + \
            block_out * torch.exp(block_lse - safe).unsqueeze(-1)
        lse[..., rows] = new_lse


def _backward_block(q5, kv, chunk, masks, lse, dout, delta, dq, dkv, scale, drop=None):
    """Add one K/V block's share of dQ (local) and of that block's dK/dV. With dropout
    ``delta = rowsum(dO * O)`` still equals ``rowsum(dP * P)`` of the undropped P."""
    for (qa, kb), mask in masks.items():
        rows = slice(qa * chunk, (qa + 1) * chunk)
        keys = slice(kb * chunk, (kb + 1) * chunk)
        scores = _scores(q5, kv[0], chunk, qa, kb, scale, mask)
        probs = torch.exp(scores - _finite(lse[..., rows]).unsqueeze(-1))
        d_out = dout[..., rows, :]
        k = kv[0][..., keys, :].unsqueeze(2).float()
        v = kv[1][..., keys, :].unsqueeze(2).float()
        keep = None if drop is None else drop(qa, kb)
        dropped = probs if keep is None else probs * keep
        dkv[1][..., keys, :] += torch.matmul(dropped.transpose(-1, -2), d_out).sum(2)
        d_probs = torch.matmul(d_out, v.transpose(-1, -2))
        if keep is not None:
            d_probs = d_probs * keep
        d_scores = probs * (d_probs - delta[..., rows].unsqueeze(-1)) * scale
        dq[..., rows, :] += torch.matmul(d_scores, k)
        dkv[0][..., keys, :] += torch.matmul(d_scores.transpose(-1, -2),
                                             q5[..., rows, :]).sum(2)


def _block_masks(rank, src, size, chunk, segment_ids, device):
    """The non-empty chunk pairs ``(query half, key half) -> mask`` of this rank's queries
    against the K/V of rank ``src``."""
    masks = {}
    for qa, q_chunk in enumerate(_chunks(rank, size)):
        for kb, k_chunk in enumerate(_chunks(src, size)):
            mask = pair_mask(q_chunk, k_chunk, chunk, segment_ids, device)
            if not (isinstance(mask, str) and mask == "none"):
                masks[(qa, kb)] = mask
    return masks


def _ring_position(group) -> tuple[int, int]:
    """(ring size, this rank's place); group None: a ring of one (no communication: this
    rank's own rows, as a lane slot of variable CP runs them)."""
    if group is None:
        return 1, 0
    return dist.get_world_size(group), dist.get_rank(group)


@dataclass(frozen=True)
class LocalRows:
    """The attention mask of a microbatch that a context-parallel chunk runs on this rank
    alone (a lane slot of ``--dynamic-context-parallel``): ``segment_ids`` of its own
    ``[b, s]`` rows (packed documents, -1 padding) or None (causal)."""

    segment_ids: torch.Tensor | None


class RingAttention(torch.autograd.Function):
    """``out = softmax(q k^T * scale + mask) v`` over the context-parallel ``group``.

    ``q``: ``[b, heads, 2c, d]``, ``k`` / ``v``: ``[b, groups, 2c, d]`` (GQA: ``heads`` a
    multiple of ``groups``; query head i uses K/V head ``i // (heads / groups)``), this
    rank's two chunks in load-balanced order. ``segment_ids``: None (causal) or the full
    row's ``[b, 2c * N]`` document ids. ``dropout``: None or the
    :class:`~odc_pp.megatron.dropout.AttentionKeys` of the local queries against the
    full rows' keys (keyed attention dropout, recomputed per block in backward).
    Returns ``[b, heads, 2c, d]`` in ``q``'s dtype."""

    @staticmethod
    def forward(ctx, q, k, v, segment_ids, group, scale, dropout=None):
        size, rank = _ring_position(group)
        batch, heads, local, dim = q.shape
        groups, chunk = k.shape[1], local // 2
        q5 = q.float().reshape(batch, groups, heads // groups, local, dim)
        out = torch.zeros_like(q5)
        lse = torch.full(q5.shape[:-1], float("-inf"), dtype=torch.float32, device=q.device)
        kv = torch.stack([k, v]).contiguous()
        for step, posts in enumerate(ring_comm_plan(rank, size)):
            incoming = torch.empty_like(kv) if step < size - 1 else None
            requests = _post(group, posts, {("send", "kv"): kv, ("recv", "kv"): incoming})
            src = (rank - step) % size
            masks = _block_masks(rank, src, size, chunk, segment_ids, q.device)
            _forward_block(q5, kv, chunk, masks, out, lse, scale,
                           _block_dropout(dropout, src, size, chunk, q5.shape))
            for request in requests:
                request.wait()
            kv = incoming
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.segment_ids, ctx.group, ctx.scale = segment_ids, group, scale
        ctx.dropout = dropout
        return out.reshape(batch, heads, local, dim).to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        group, scale, segment_ids = ctx.group, ctx.scale, ctx.segment_ids
        size, rank = _ring_position(group)
        chunk = q.shape[2] // 2
        q5 = q.float().reshape(out.shape)
        dout = grad_out.float().reshape(out.shape)
        delta = (dout * out).sum(-1)
        dq = torch.zeros_like(q5)
        kv = torch.stack([k, v]).contiguous()
        dkv_done = None
        for step, posts in enumerate(ring_comm_plan(rank, size, backward=True)):
            incoming = torch.empty_like(kv) if step < size - 1 else None
            dkv_in = torch.empty_like(dkv_done) if step > 0 else None
            requests = _post(group, posts, {("send", "kv"): kv, ("recv", "kv"): incoming,
                                            ("send", "dkv"): dkv_done, ("recv", "dkv"): dkv_in})
            dkv = torch.zeros((2,) + tuple(k.shape), dtype=torch.float32, device=k.device)
            if step < size:  # the extra last step only brings this rank's dK/dV home
                src = (rank - step) % size
                masks = _block_masks(rank, src, size, chunk, segment_ids, q.device)
                _backward_block(q5, kv, chunk, masks, lse, dout, delta, dq, dkv, scale,
                                _block_dropout(ctx.dropout, src, size, chunk, q5.shape))
            for request in requests:
                request.wait()
            if dkv_in is not None:
                dkv += dkv_in
            dkv_done, kv = dkv, incoming
        dq = dq.reshape(q.shape).to(q.dtype)
        return dq, dkv_done[0].to(k.dtype), dkv_done[1].to(v.dtype), None, None, None, None


def ring_attention(q, k, v, *, group, scale: float, segment_ids=None, dropout=None):
    """:class:`RingAttention` with keyword arguments (see there)."""
    if q.shape[2] % 2:
        raise ValueError(f"the local sequence must hold two equal chunks, got "
                         f"{q.shape[2]} tokens")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"{q.shape[1]} query heads are not a multiple of "
                         f"{k.shape[1]} key/value heads")
    if segment_ids is not None:
        segment_ids = segment_ids.to(q.device)
    return RingAttention.apply(q, k, v, segment_ids, group, scale, dropout)


# ---- all-to-all (Ulysses, Megatron's a2a cp_comm_type) ---------------------------------


class _AllToAll(torch.autograd.Function):
    """``dist.all_to_all_single`` of equal parts along dim 0; its gradient is the same
    exchange of the output gradient."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        x = x.contiguous()  # empty_like keeps a permuted input's strides
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        out = torch.empty_like(grad)
        dist.all_to_all_single(out, grad, group=ctx.group)
        return out, None


def _heads_to_sequence(x: torch.Tensor, group) -> torch.Tensor:
    """``[b, n, L, d]`` (this rank's tokens, every head) -> ``[b, n / N, N * L, d]`` (this
    rank's heads, every rank's tokens in rank order) by one differentiable all-to-all."""
    size = dist.get_world_size(group)
    batch, heads, local, dim = x.shape
    parts = x.reshape(batch, size, heads // size, local, dim).transpose(0, 1).contiguous()
    gathered = _AllToAll.apply(parts, group)
    return gathered.permute(1, 2, 0, 3, 4).reshape(batch, heads // size, size * local, dim)


def _sequence_to_heads(x: torch.Tensor, group) -> torch.Tensor:
    """The inverse of :func:`_heads_to_sequence`."""
    size = dist.get_world_size(group)
    batch, heads, tokens, dim = x.shape
    parts = x.reshape(batch, heads, size, tokens // size, dim).permute(2, 0, 1, 3, 4)
    scattered = _AllToAll.apply(parts, group)
    return scattered.transpose(0, 1).reshape(batch, heads * size, tokens // size, dim)


def ulysses_attention(q, k, v, *, group, scale: float, segment_ids=None, dropout=None):
    """Attention over the CP group by all-to-all (Megatron's ``a2a``): queries, keys and
    values trade their heads for the sequence, every rank attends the whole sequence with
    ``heads / N`` heads (fp32 softmax, the causal / document mask in the gathered
    load-balanced order), and the output trades back. Same arguments and result as
    :func:`ring_attention`; query and K/V head counts must be multiples of N. ``dropout``:
    None or the :class:`~odc_pp.megatron.dropout.AttentionKeys` of this rank's heads over
    the gathered sequence (queries and keys in the gathered order)."""
    size = dist.get_world_size(group)
    if q.shape[1] % size or k.shape[1] % size:
        raise ValueError(f"--cp-comm-type a2a needs the query heads ({q.shape[1]}) and "
                         f"key/value heads ({k.shape[1]}) divisible by the CP size {size}")
    qs, ks, vs = (_heads_to_sequence(t, group) for t in (q, k, v))
    if segment_ids is not None:
        segment_ids = segment_ids.to(q.device)
    seq = qs.shape[2]
    order = torch.cat([cp_token_indices(seq, r, size) for r in range(size)]).to(q.device)
    allowed = order.unsqueeze(1) >= order.unsqueeze(0)
    if segment_ids is not None:
        ids = segment_ids[:, order]
        allowed = allowed & (ids.unsqueeze(2) == ids.unsqueeze(1)) & (ids >= 0).unsqueeze(2)
        allowed = allowed | torch.eye(seq, dtype=torch.bool, device=q.device)
        allowed = allowed[:, None]
    groups = qs.shape[1] // ks.shape[1]
    scores = torch.matmul(qs.float(), ks.repeat_interleave(groups, 1).float()
                          .transpose(-1, -2)) * scale
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    if dropout is not None:
        probs = probs * (dropout.keep().float() * dropout.scale)
    out = torch.matmul(probs, vs.repeat_interleave(groups, 1).float()).to(q.dtype)
    return _sequence_to_heads(out, group)
