"""Tensor- and sequence-parallel pieces odc_pp owns, all on an explicit process group.

megatron-core's tensor-parallel layers take the group they run on (``tp_group``); its
vocab-parallel cross entropy reads ``parallel_state`` instead, which odc_pp never
initialises, so :func:`vocab_parallel_cross_entropy` is ours. megatron's sequence-parallel mappings allocate
their outputs on the current CUDA device, so under sequence parallelism the embedding's
scatter, the row-parallel reduce-scatter and the output layer's gather are the autograd
functions here, device-agnostic. The row collectives are also what the deferrable linears
(:mod:`odc_pp.megatron.layers`) call inside their autograd functions: all-gather / reduce-scatter along the sequence (dim 0) for sequence
parallelism, all-reduce for the input gradient of a column-parallel linear.

:class:`TensorParallel` describes this rank's tensor-parallel setting;
:func:`reduce_partial_grads` makes the replicated parameters whose gradients are partial
sums per rank (:func:`odc_pp.megatron.tp_layout.grad_is_partial`) hold the full gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from .tp_layout import grad_is_partial

__all__ = ["TensorParallel", "all_gather_rows", "reduce_scatter_rows", "all_reduce_sum",
           "scatter_sequence", "reduce_scatter_sequence",
           "vocab_parallel_cross_entropy", "reduce_partial_grads"]


@dataclass(kw_only=True)
class TensorParallel:
    """This rank's tensor-parallel setting."""

    group: object = None
    """The tensor-parallel process group (None: tp = 1)."""
    sequence_parallel: bool = False
    """Activations outside the tensor-parallel regions are split along the sequence
    (Megatron's ``--sequence-parallel``); needs a group of size > 1."""
    keep_sp_input_for_w: bool = False
    """Under sequence parallelism, keep the all-gathered input of a column-parallel linear
    from B until its deferred W (more memory) instead of gathering it again in W (more
    communication)."""

    def __post_init__(self) -> None:
        if self.sequence_parallel and self.size == 1:
            raise ValueError("sequence parallelism needs a tensor-parallel size > 1 "
                             "(--sequence-parallel with --tensor-model-parallel-size 1)")
        if self.keep_sp_input_for_w and not self.sequence_parallel:
            raise ValueError("--keep-sp-input-for-w needs --sequence-parallel")

    @property
    def size(self) -> int:
        return 1 if self.group is None else dist.get_world_size(self.group)

    @property
    def rank(self) -> int:
        return 0 if self.group is None else dist.get_rank(self.group)


def all_gather_rows(tensor: torch.Tensor, group) -> torch.Tensor:
    """Concatenation over ``group``'s ranks of ``tensor`` along dim 0."""
    size = dist.get_world_size(group)
    tensor = tensor.contiguous()
    out = torch.empty((tensor.shape[0] * size, *tensor.shape[1:]), dtype=tensor.dtype,
                      device=tensor.device)
    dist.all_gather_into_tensor(out, tensor, group=group)
    return out


def reduce_scatter_rows(tensor: torch.Tensor, group) -> torch.Tensor:
    """This rank's dim-0 slice of the sum over ``group`` of ``tensor``."""
    size = dist.get_world_size(group)
    if tensor.shape[0] % size:
        raise ValueError(f"sequence length {tensor.shape[0]} is not divisible by the "
                         f"tensor-parallel size {size}")
    tensor = tensor.contiguous()
    out = torch.empty((tensor.shape[0] // size, *tensor.shape[1:]), dtype=tensor.dtype,
                      device=tensor.device)
    dist.reduce_scatter_tensor(out, tensor, group=group)
    return out


def all_reduce_sum(tensor: torch.Tensor, group) -> torch.Tensor:
    """``tensor`` summed over ``group`` (in place; returned)."""
    dist.all_reduce(tensor, group=group)
    return tensor


class _ScatterSequence(torch.autograd.Function):
    """Forward: this rank's slice along the sequence of a tensor every rank holds whole.
    Backward: all-gather of the gradient slices."""

    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        if tensor.shape[0] % size:
            raise ValueError(f"sequence length {tensor.shape[0]} is not divisible by the "
                             f"tensor-parallel size {size}")
        rows = tensor.shape[0] // size
        return tensor[rank * rows:(rank + 1) * rows].clone()

    @staticmethod
    def backward(ctx, grad):
        return all_gather_rows(grad, ctx.group), None


def scatter_sequence(tensor: torch.Tensor, group) -> torch.Tensor:
    """This rank's sequence shard of a replicated ``tensor`` (the embedding output)."""
    return _ScatterSequence.apply(tensor, group)


class _ReduceScatterSequence(torch.autograd.Function):
    """Forward: sum over the group, this rank's sequence slice (a row-parallel linear's
    output under sequence parallelism). Backward: all-gather."""

    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        return reduce_scatter_rows(tensor, group)

    @staticmethod
    def backward(ctx, grad):
        return all_gather_rows(grad, ctx.group), None


def reduce_scatter_sequence(tensor: torch.Tensor, group) -> torch.Tensor:
    """Sum of the partial ``tensor`` over ``group``, split along the sequence."""
    return _ReduceScatterSequence.apply(tensor, group)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-token cross entropy of logits split along the vocabulary over ``group``."""

    @staticmethod
    def forward(ctx, logits, labels, group):
        vocab_local = logits.shape[-1]
        start = dist.get_rank(group) * vocab_local
        logits_max = logits.max(dim=-1).values
        dist.all_reduce(logits_max, op=dist.ReduceOp.MAX, group=group)
        shifted = logits - logits_max.unsqueeze(-1)
        inside = (labels >= start) & (labels < start + vocab_local)
        local_labels = torch.where(inside, labels - start, torch.zeros_like(labels))
        target = shifted.gather(-1, local_labels.unsqueeze(-1)).squeeze(-1)
        target = torch.where(inside, target, torch.zeros_like(target))
        exp = shifted.exp()
        sum_exp = exp.sum(dim=-1)
        both = torch.stack((target, sum_exp))
        dist.all_reduce(both, group=group)
        target, sum_exp = both[0], both[1]
        softmax = exp.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(softmax, local_labels, inside)
        return sum_exp.log() - target

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, local_labels, inside = ctx.saved_tensors
        grad = softmax.clone()
        grad.scatter_add_(-1, local_labels.unsqueeze(-1), -inside.to(grad.dtype).unsqueeze(-1))
        return grad * grad_loss.unsqueeze(-1), None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, labels: torch.Tensor,
                                 group) -> torch.Tensor:
    """Per-token losses (shape of ``labels``) from fp32 ``logits [..., vocab / tp]`` split
    along the vocabulary over ``group``, in rank order; every rank gets the same losses."""
    return _VocabParallelCrossEntropy.apply(logits, labels, group)


def reduce_partial_grads(named_parameters, tensor_parallel: TensorParallel) -> list[str]:
    """Hooks that sum the gradient of every replicated parameter with partial gradients
    over the tensor-parallel group as it is computed (each backward use), so ``.grad``
    holds the full, rank-identical gradient. ``named_parameters``: (global name, param).
    Returns the names hooked."""
    hooked = []
    group = tensor_parallel.group
    for name, param in named_parameters:
        if grad_is_partial(name, tp_size=tensor_parallel.size,
                           sequence_parallel=tensor_parallel.sequence_parallel):
            param.register_hook(lambda grad: all_reduce_sum(grad.clone(), group))
            hooked.append(name)
    return hooked
