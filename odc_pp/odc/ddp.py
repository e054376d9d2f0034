"""``--dp-mode ddp``: Megatron's data parallelism (DDP with the distributed optimizer) on the
engine's units.

Every data-parallel replica keeps each unit's full parameters resident (compute dtype,
replicated; never released), sums the minibatch's weight gradients of the whole unit
locally in ``main_grad`` (fp32; bf16 with ``--grad-reduce-in-bf16``), and reduce-scatters
them over the data-parallel group once per minibatch: rank r receives the sum of its
owned range (``shard_range``) into its fp32 accumulator. The optimizer
(:class:`~odc_pp.odc.sharded_optimizer.ShardedAdamW`, Megatron's distributed optimizer)
steps the owned fp32 master shard and AdamW moments; :meth:`finish_step` then all-gathers
the updated shards into every replica's full copy.

Overlap: a unit's reduce-scatter starts (asynchronously) as soon as this replica's last
microbatch's weight gradients of it are in, while the other chunks' backward goes on;
:meth:`finish_minibatch` waits for them. The reduce-scatters are issued in one order on
every replica, descending unit index (a later pipeline stage finishes its backward
first), a unit waiting for those before it: they pair up whatever each replica's
microbatch count (the training job asks for equal counts, ``odc_pp.training.job``).

Memory per rank and unit of P elements over dp ranks, ``S = ceil(P / dp)``: ``e * dp * S``
replicated parameters (padded to whole shards; each rank's parameter shard is its slice
of them, no copy), ``g * P`` for ``main_grad`` (g = 4, or 2 in bf16), and sharded: the
fp32 gradient accumulator ``4 * S`` and the optimizer's ``12 * S`` (fp32 master, two
moments) -- Megatron's 4 + 16/dp bytes per parameter with bf16 gradients. The shard layout is the collective and odc modes' one, so
checkpoints resume across the three modes.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from . import primitives as prim
from .engine import ShardedDataParallel
from .engine_config import OdcConfig, into_main_grad
from .flat_unit import FlatUnit

__all__ = ["ReplicatedDataParallel"]


class ReplicatedDataParallel(ShardedDataParallel):
    """:class:`ShardedDataParallel` with replicated parameters (module docstring);
    ``config.mode`` must be ``ddp`` and ``config.unit_driver`` ``pipeline``."""

    def __init__(self, modules: Sequence[nn.Module], config: OdcConfig, group,
                 **kwargs) -> None:
        if not config.mode.is_ddp:
            raise ValueError(f"ReplicatedDataParallel runs --dp-mode ddp, got "
                             f"{config.mode.value!r}")
        self._weights_done: list[int] = []
        self._reduced: list[bool] = []
        self._expected: int | None = None
        self._buckets: dict[int, torch.Tensor] = {}
        # the units' gathered buffers hold the initial parameters after construction and
        # _release keeps them: every replica starts with the full (identical) copy
        super().__init__(modules, config, group, **kwargs)
        self._weights_done = [0] * len(self.units)
        self._reduced = [False] * len(self.units)
        self._padded: dict[int, torch.Tensor] = {}
        for unit in self.units:
            if not unit.aliased:
                self._share_shard(unit)

    def _share_shard(self, unit: FlatUnit) -> None:
        """Make the unit's parameter shard a view of its replicated parameters: one
        buffer of ``dp x S`` elements whose r-th slice of S is rank r's shard, so the
        all-gather after the step lands in place and the shard costs no memory of its own."""
        (segment,) = unit.segments  # minibatch residency: the whole unit
        size = unit.shard_numel
        padded = torch.zeros(size * self.group.world_size, dtype=segment.buffer.dtype,
                             device=segment.buffer.device)
        padded[:unit.numel].copy_(segment.buffer)
        segment.buffer = padded[:unit.numel]
        segment.nbytes = padded.untyped_storage().nbytes()
        start = self.group.rank * size
        unit.param_shard = padded[start:start + size]
        unit.point_params()
        self._padded[unit.index] = padded

    def _new_main_grad(self, unit: FlatUnit) -> torch.Tensor:
        """``main_grad`` as the head of a bucket of ``dp x S`` elements (zero padding), so
        the reduce-scatter reads it in place, with no padded copy."""
        if unit.aliased:
            return super()._new_main_grad(unit)
        bucket = torch.zeros(unit.shard_numel * self.group.world_size,
                             dtype=getattr(torch, self.config.main_grad_dtype),
                             device=unit.param_shard.device)
        self._buckets[unit.index] = bucket
        return bucket[:unit.numel]

    def _release(self, unit: FlatUnit) -> None:
        """Replicated parameters are never released."""

    def begin_minibatch(self, *, max_microbatches: int | None = None,
                        num_microbatches: int | None = None) -> None:
        """Start a minibatch; with ``num_microbatches`` (this replica's count) the
        reduce-scatters overlap the backward, else they all start at the end."""
        super().begin_minibatch(max_microbatches=max_microbatches,
                                num_microbatches=num_microbatches)
        self._expected = num_microbatches
        self._weights_done = [0] * len(self.units)
        self._reduced = [False] * len(self.units)

    def after_weight_grad(self, chunk: int, microbatch: int) -> None:
        """The weight gradients of (chunk, microbatch) are in ``main_grad``; the
        reduce-scatters of the units whose last microbatch is done start, in the issue
        order (descending unit index) as far as it goes."""
        super().after_weight_grad(chunk, microbatch)
        self._weights_done[chunk] += 1
        for unit in reversed(self.units):  # the one issue order of every replica
            if self._reduced[unit.index]:
                continue
            if self._expected is None or self._weights_done[unit.index] < self._expected:
                return
            self._reduce(unit)

    def _reduce(self, unit: FlatUnit) -> None:
        """Start the reduce-scatter of the unit's bucket (once per minibatch); it stays
        untouched until :meth:`finish_step` zeroes it."""
        if self._reduced[unit.index]:
            return
        self._reduced[unit.index] = True
        for param in unit.params:
            if param.grad is not None:  # set outside autograd's accumulation
                into_main_grad(param)
        if not unit.aliased:  # dp=1: main_grad is the owner's accumulator
            self._push(unit, self._buckets[unit.index], retain=True)

    def finish_minibatch(self) -> None:
        """Reduce-scatter the units not reduced yet (in the issue order), wait for every
        reduce-scatter; afterwards the owned accumulators hold the minibatch's sums."""
        for unit in reversed(self.units):
            self._reduce(unit)
        self._wait_pushes()
        prim.sync(self.group)
        if self._tied is not None:
            self._tied.sum()

    def finish_step(self) -> None:
        """After the optimizer wrote the owned parameter shards: zero the gradients and
        all-gather the shards into every replica's full parameters."""
        for unit in self.units:
            unit.grad_acc.zero_()
            if unit.main_grad is not None and not unit.aliased:
                unit.main_grad.zero_()
            unit.clear_grads()
        prim.sync(self.group)
        for unit in self.units:
            if not unit.aliased:  # (the shard is a slice of the output: gathered from a copy)
                prim.gather_into_tensor(self._padded[unit.index], unit.param_shard.clone(),
                                        self.group)
