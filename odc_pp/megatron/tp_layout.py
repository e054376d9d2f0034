"""How every GPT parameter is split over tensor-parallel ranks: the one table.

Megatron's tensor-parallel layout, stated per global parameter name (the names of
:meth:`odc_pp.megatron.model.GPTChunk.global_named_parameters`). A full (tp=1) tensor and
its ``tp`` shards convert both ways through :class:`Partition`; initialisation, HF
import/export and checkpoint resharding all go through it, so a model is the same
function at every tp size.

==========================================  ================================================
parameter                                   split
==========================================  ================================================
``word_embeddings``, ``output_layer``       vocabulary rows (dim 0)
``linear_qkv`` weight/bias                  rows (dim 0); megatron groups the rows per query
                                            group ``[q heads of the group, k, v]``, so a
                                            contiguous split hands each rank whole groups
``linear_fc1`` weight/bias (GeLU)           rows (dim 0)
``linear_fc1`` weight/bias (SwiGLU)         rows of each half: the full rows are
                                            ``[gate; up]`` and rank r holds
                                            ``[gate_r; up_r]`` (*gated*)
``linear_proj``/``linear_fc2`` weight       columns (dim 1)
everything else (norms, row-parallel        replicated
biases, position embeddings)
==========================================  ================================================

Replicated parameters that see only a part of the data on each tensor-parallel rank get
*partial* gradients that must be summed over the tp group (:func:`grad_is_partial`):
under sequence parallelism the layer norms and the row-parallel biases (they act on a
sequence shard), and at any tp > 1 the per-head q/k norms (each rank holds other heads).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

__all__ = ["Partition", "REPLICATED", "partition_of", "grad_is_partial", "shard", "unshard"]


@dataclass(frozen=True)
class Partition:
    """How one parameter is split: along ``dim`` (None: replicated), ``gated``: the
    split dimension is two stacked halves, each split separately (SwiGLU's fc1)."""

    dim: int | None
    gated: bool = False

    @property
    def replicated(self) -> bool:
        return self.dim is None

    def check(self, full_shape: torch.Size | tuple, size: int, name: str = "tensor") -> None:
        """ValueError unless a tensor of ``full_shape`` splits evenly into ``size``."""
        if self.dim is None or size == 1:
            return
        parts = size * (2 if self.gated else 1)
        if full_shape[self.dim] % parts:
            raise ValueError(f"{name}: dimension {self.dim} of size {full_shape[self.dim]} "
                             f"does not split into {parts} equal parts for tensor-parallel "
                             f"size {size}")

    def local_shape(self, full_shape: torch.Size | tuple, size: int) -> torch.Size:
        shape = list(full_shape)
        if self.dim is not None:
            shape[self.dim] //= size
        return torch.Size(shape)

    def full_shape(self, local_shape: torch.Size | tuple, size: int) -> torch.Size:
        shape = list(local_shape)
        if self.dim is not None:
            shape[self.dim] *= size
        return torch.Size(shape)

    def shard(self, full: torch.Tensor, rank: int, size: int) -> torch.Tensor:
        """Rank ``rank``'s part of ``full`` (a view when possible; copy before writing)."""
        if self.dim is None or size == 1:
            return full
        self.check(full.shape, size)
        if not self.gated:
            return full.chunk(size, dim=self.dim)[rank]
        gate, up = full.chunk(2, dim=self.dim)
        return torch.cat((gate.chunk(size, dim=self.dim)[rank],
                          up.chunk(size, dim=self.dim)[rank]), dim=self.dim)

    def unshard(self, shards: list[torch.Tensor]) -> torch.Tensor:
        """The full tensor from the shards of ranks ``0 .. len(shards) - 1``."""
        if self.dim is None or len(shards) == 1:
            return shards[0]
        if not self.gated:
            return torch.cat(shards, dim=self.dim)
        halves = [shard.chunk(2, dim=self.dim) for shard in shards]
        return torch.cat([gate for gate, _ in halves] + [up for _, up in halves], dim=self.dim)


REPLICATED = Partition(None)
_ROWS = Partition(0)
_GATED_ROWS = Partition(0, gated=True)
_COLUMNS = Partition(1)

_RULES = (
    (re.compile(r"(^|\.)(word_embeddings|output_layer)\.weight$"), _ROWS),
    (re.compile(r"(^|\.)linear_qkv\.(weight|bias)$"), _ROWS),
    (re.compile(r"(^|\.)linear_fc1\.(weight|bias)$"), None),  # gated or not
    (re.compile(r"(^|\.)(linear_proj|linear_fc2)\.weight$"), _COLUMNS),
)
_SP_PARTIAL = re.compile(r"(^|\.)((input|pre_mlp|final)_layernorm\.(weight|bias)"
                         r"|(linear_proj|linear_fc2)\.bias)$")
_HEAD_PARTIAL = re.compile(r"(^|\.)(q|k)_layernorm\.(weight|bias)$")


def partition_of(name: str, *, gated_mlp: bool) -> Partition:
    """How the parameter with global name ``name`` is split over tensor-parallel ranks
    (``gated_mlp``: the MLP is SwiGLU, so ``linear_fc1`` is gated)."""
    for pattern, partition in _RULES:
        if pattern.search(name):
            if partition is None:
                return _GATED_ROWS if gated_mlp else _ROWS
            return partition
    return REPLICATED


def grad_is_partial(name: str, *, tp_size: int, sequence_parallel: bool) -> bool:
    """The gradient of replicated parameter ``name`` is a partial sum on each tp rank and
    must be summed over the tensor-parallel group."""
    if tp_size == 1:
        return False
    if _HEAD_PARTIAL.search(name):
        return True
    return sequence_parallel and bool(_SP_PARTIAL.search(name))


def shard(name: str, full: torch.Tensor, *, rank: int, size: int,
          gated_mlp: bool) -> torch.Tensor:
    """Rank ``rank``'s part of the full parameter ``name``."""
    partition = partition_of(name, gated_mlp=gated_mlp)
    partition.check(full.shape, size, name)
    return partition.shard(full, rank, size)


def unshard(name: str, shards: list[torch.Tensor], *, gated_mlp: bool) -> torch.Tensor:
    """The full parameter ``name`` from its shards in tensor-parallel rank order."""
    return partition_of(name, gated_mlp=gated_mlp).unshard(shards)
