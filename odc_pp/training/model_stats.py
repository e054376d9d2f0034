"""Megatron's ``--log-params-norm`` and ``--log-num-zeros-in-grad``: the L2 norm of all
parameters and the count of gradient elements that are exactly zero, for the log record.

Each rank counts only what it owns -- the sharded AdamW's owned pieces of its stage's
parameters and gradients (fp32 master weights; gradients as accumulated), without the
replicated copies tensor parallelism keeps on more than one rank (the optimizer's norm
mask) -- and the two local sums are all-reduced over the optimizer's ``norm_groups``: the
group(s) of :mod:`odc_pp.optim.clip` whose ranks hold disjoint pieces that make the whole
model, the ones the global gradient norm is reduced over. So every element counts once
on any layout (pp x dp, tensor parallel, hierarchical), and the values equal those of one
process holding the whole model (up to float rounding of the sum of squares).

The zero count is taken when a minibatch's gradients are final, before the step
(:class:`ZeroCountingStep` wraps the runtime's optimizer step); the parameters' norm
after the step, at the end of the iteration.
"""

from __future__ import annotations

import datetime
import math

import torch
import torch.distributed as dist

from odc_pp.optim import clip
from odc_pp.odc.shard_map import param_pieces
from odc_pp.optim.step import OptimizerStep, StepReport, StepOutcome

__all__ = ["ZeroCountingStep", "ModelStats", "owned_pieces", "counted_masks"]


def counted_masks(optimizer) -> list[torch.Tensor | None]:
    """Per owned shard of ``optimizer``: a bool mask of the elements that count -- those
    of a parameter (not the padding of a shard) that its norm mask keeps -- or None when
    all do."""
    masks = []
    for unit, norm_mask in zip(optimizer.engine.units, optimizer.norm_mask):
        covered = torch.zeros(unit.owned_numel, dtype=torch.bool, device=unit.grad_acc.device)
        for shape, offset in zip(unit.shapes, unit.offsets):
            for low, high, start in param_pieces(unit.owned, offset, math.prod(shape)):
                covered[start:start + high - low] = True
        if norm_mask is not None:
            covered &= norm_mask.to(covered.device)
        masks.append(None if bool(covered.all()) else covered)
    return masks


def owned_pieces(masks: list[torch.Tensor | None],
                 tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """``tensors`` (one per owned shard) at ``masks`` (:func:`counted_masks`): without the
    shards' padding and the tensor-parallel replicas."""
    return [t if mask is None else t[mask.to(t.device)] for t, mask in zip(tensors, masks)]


class ZeroCountingStep:
    """An :class:`~odc_pp.optim.step.OptimizerStep` that counts this rank's zero gradient
    elements each time the gradients are final, then takes ``inner``'s step."""

    def __init__(self, inner: OptimizerStep, optimizer) -> None:
        self.inner, self.optimizer = inner, optimizer
        self.masks = counted_masks(optimizer)
        self.local_zeros: torch.Tensor | None = None
        """This rank's count of the last final gradients (a float64 tensor; no sync)."""

    @property
    def deferred(self) -> bool:
        return self.inner.deferred

    def gradients_final(self, lr: float | None) -> StepReport:
        grads = owned_pieces(self.masks, self.optimizer.engine.owned_grads())
        device = self.optimizer.master[0].device
        total = torch.zeros((), dtype=torch.float64, device=device)
        for grad in grads:
            total += (grad == 0).sum().to(device=device, dtype=torch.float64)
        self.local_zeros = total
        return self.inner.gradients_final(lr)

    def validate(self) -> StepOutcome | None:
        return self.inner.validate()

    def __getattr__(self, name):  # the wrapped step's other attributes (tests' hooks)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


class ModelStats:
    """The record's ``params_norm`` and ``num_zeros_in_grad`` of one rank's components
    (every rank takes part in the reduction)."""

    def __init__(self, parts, *, params_norm: bool, zeros: bool, timeout_s: float) -> None:
        self.parts, self.params_norm, self.zeros = parts, params_norm, zeros
        self.timeout_s = timeout_s
        self.masks = counted_masks(parts.optimizer)

    def local(self) -> torch.Tensor:
        """(sum of squares of the owned master weights, zero gradient count) of this rank,
        float64, taken now (after the iteration's step)."""
        optimizer = self.parts.optimizer
        device = optimizer.master[0].device
        squares = clip.local_sum_of_squares(owned_pieces(self.masks, optimizer.master),
                                            dtype=torch.float64, device=device) \
            if self.params_norm else torch.zeros((), dtype=torch.float64, device=device)
        counted = getattr(self.parts.optimizer_step, "local_zeros", None)
        zeros = counted if self.zeros and counted is not None else \
            torch.zeros((), dtype=torch.float64, device=device)
        return torch.stack([squares.to(torch.float64), zeros.to(device)])

    def record(self, local: torch.Tensor, skipped: bool | None) -> dict:
        """The record's entries from :meth:`local`'s pair, summed over the norm groups
        (collective); a skipped step has no zero count (as Megatron)."""
        values = local.clone()
        for index, group in enumerate(clip.group_list(self.parts.optimizer.norm_groups)):
            work = dist.all_reduce(values, group=group, async_op=True)
            if work.wait(timeout=datetime.timedelta(seconds=self.timeout_s)) is False:
                raise TimeoutError(f"parameter norm / zero count: all-reduce {index + 1} did "
                                   f"not complete within {self.timeout_s}s")
        squares, zeros = values.tolist()
        out = {}
        if self.params_norm:
            out["params_norm"] = math.sqrt(squares)
        if self.zeros:
            out["num_zeros_in_grad"] = None if skipped else int(round(zeros))
        return out
