"""Settings of :class:`~odc_pp.odc.engine.ShardedDataParallel`, the layout record of one
unit, and where a microbatch's weight gradients go (``grad_accumulation``; see the
engine's docstring)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from ..dtypes import float_dtype
from ..layout import DataParallelMode
from .shard_map import owned_numel

__all__ = ["OdcConfig", "UnitLayout", "accumulates_locally", "into_main_grad"]


@dataclass(kw_only=True)
class OdcConfig:
    """Settings of :class:`ShardedDataParallel`."""

    mode: DataParallelMode = DataParallelMode.ODC
    """Transport pattern: one-sided ODC, per-unit collectives (FSDP baseline), or ODC inside a
    host plus one all-reduce per minibatch across hosts. Must match the group's backend
    (``collective`` needs a ``backend="collective"`` group, the others ``"odc"``)."""
    unit_driver: Literal["module_hooks", "pipeline"] = "module_hooks"
    """Who triggers gathers and pushes: module hooks (plain ``nn.Module`` training) or the
    pipeline runtime through the ``StageDataParallel`` methods."""
    keep_params_through_backward: bool = True
    """module_hooks only: keep a unit gathered from its forward until its backward is done
    (True) or release it after forward and gather it again for backward (False)."""
    param_dtype: str = "float32"
    """Compute dtype of gathered parameters and of gradients: float32, bfloat16 or float16.
    Master weights, optimizer state and gradient accumulators are always float32."""
    prefetch: bool = True
    """module_hooks driver, odc and hierarchical modes: while a unit computes, gather the
    next one (forward: the following unit, backward: the preceding one) on a helper thread.
    ``param_residency='layer'``: likewise the next layer (backward: the preceding one),
    on the transport's helper thread or CUDA gather streams (odc_pp.odc.residency).
    Ignored in collective mode, whose collectives must stay in one issue order."""
    max_inflight_pushes: int = 8
    """Gradient pushes that may be outstanding before the oldest is waited for (bounds the
    memory of flattened gradients kept alive for asynchronous transports)."""
    grad_accumulation: Literal["auto", "local", "push"] = "auto"
    """pipeline driver: where each microbatch's weight gradients go. ``local``: straight
    into an fp32 accumulator of the whole unit (``param.main_grad``; at dp=1 it is the
    owner's accumulator itself), pushed to the owners once, at :meth:`finish_minibatch`:
    no compute-dtype gradient buffers. ``push``: into ``.grad`` (compute dtype), flattened
    and pushed after every W or BW, so the transfer overlaps compute. ``auto``: local
    unless the transport adds each push into the owners as it arrives (dp > 1 in a
    non-deterministic odc or hierarchical group, or collective mode, whose per-microbatch
    reduce-scatter is the FSDP baseline); a deterministic group stages every push in an
    fp32 buffer of the whole unit until the sync anyway."""
    main_grad_dtype: str = "float32"
    """grad_accumulation 'local', dp > 1: dtype of each unit's ``main_grad``, summed over
    the minibatch's microbatches and pushed into the owners' fp32 accumulators once:
    float32, or bfloat16 (Megatron's ``--grad-reduce-in-bf16``: half the bytes, bf16
    summation over microbatches). At dp=1 ``main_grad`` is the owner's fp32 accumulator
    whatever this says."""
    param_residency: Literal["minibatch", "layer"] = "minibatch"
    """pipeline driver, odc and hierarchical modes: how long gathered parameters live
    (odc_pp.odc.residency). ``minibatch``: a chunk from its first use to the step.
    ``layer``: each of the modules passed as ``layers`` only while it computes (FSDP's
    per-layer gather and free), the rest of the chunk as in ``minibatch``; each of those
    segments is sharded over all ranks on its own (odc_pp.odc.shard_map), so a layer's
    gather reads from every rank."""
    check_collective_order: bool = True
    """collective mode: verify that each microbatch issued the canonical sequence of
    collectives that padding replays (a mismatch would otherwise pair wrong collectives)."""

    def __post_init__(self) -> None:
        self.mode = DataParallelMode.parse(self.mode)  # a --dp-mode string is accepted
        if self.unit_driver not in ("module_hooks", "pipeline"):
            raise ValueError(f"unit_driver must be 'module_hooks' or 'pipeline', got "
                             f"{self.unit_driver!r}")
        float_dtype(self.param_dtype, what="param_dtype")
        if self.grad_accumulation not in ("auto", "local", "push"):
            raise ValueError(f"grad_accumulation must be 'auto', 'local' or 'push', got "
                             f"{self.grad_accumulation!r}")
        if self.grad_accumulation == "local" and self.unit_driver != "pipeline":
            raise ValueError("grad_accumulation='local' needs unit_driver='pipeline'")
        if self.main_grad_dtype not in ("float32", "bfloat16"):
            raise ValueError(f"main_grad_dtype must be 'float32' or 'bfloat16', got "
                             f"{self.main_grad_dtype!r}")
        if self.param_residency not in ("minibatch", "layer"):
            raise ValueError(f"param_residency must be 'minibatch' or 'layer', got "
                             f"{self.param_residency!r}")
        if self.param_residency == "layer" and (self.unit_driver != "pipeline"
                                                or self.mode.transport == "collective"):
            raise ValueError("param_residency='layer' needs unit_driver='pipeline' and the "
                             "one-sided odc or hierarchical mode")
        if self.mode.is_ddp and (self.unit_driver != "pipeline"
                                 or self.grad_accumulation == "push"):
            raise ValueError("mode='ddp' needs unit_driver='pipeline' and local gradient "
                             "accumulation (its main_grad is reduce-scattered once)")
        if self.max_inflight_pushes < 1:
            raise ValueError(f"max_inflight_pushes must be >= 1, got {self.max_inflight_pushes}")

    @property
    def torch_param_dtype(self) -> torch.dtype:
        return float_dtype(self.param_dtype, what="param_dtype")


def accumulates_locally(config: OdcConfig, *, dp: int, deterministic: bool) -> bool:
    """Whether an engine with ``config`` over a group of ``dp`` members (deterministic or
    not) sums weight gradients in fp32 ``main_grad`` buffers (OdcConfig.grad_accumulation);
    the memory model asks the same question."""
    if config.grad_accumulation != "auto" or config.mode.is_ddp:
        return config.grad_accumulation != "push"
    if config.unit_driver != "pipeline" or config.mode.is_collective:
        return False
    return dp == 1 or deterministic


@dataclass(frozen=True, kw_only=True)
class UnitLayout:
    """Where one unit's trainable parameters live in its flat buffer, and which part of
    that buffer this rank owns (:meth:`ShardedDataParallel.layout`). Checkpoints record it
    so that optimizer shards can be reassembled under another layout."""

    index: int
    """Position of the unit in the module list given to the engine."""
    module: nn.Module
    """The unit's module."""
    names: tuple[str, ...]
    """Trainable parameter names, as ``module.named_parameters()`` gives them, in flat order."""
    shapes: tuple[tuple[int, ...], ...]
    """Shape of each parameter."""
    offsets: tuple[int, ...]
    """Offset of each parameter in the flat buffer."""
    numel: int
    """Elements of the flat buffer."""
    owned: tuple[tuple[int, int, int], ...]
    """This rank's owned ``(flat_lo, flat_hi, shard_lo)`` pieces: flat elements
    ``[flat_lo, flat_hi)`` at shard positions from ``shard_lo`` (odc_pp.odc.shard_map; one
    piece at 0, or none, when the unit is sharded contiguously)."""

    def __post_init__(self) -> None:
        if not len(self.names) == len(self.shapes) == len(self.offsets):
            raise ValueError("names, shapes and offsets must have one entry per parameter")
        for lo, hi, at in self.owned:
            if not (0 <= lo < hi <= self.numel and at >= 0):
                raise ValueError(f"owned piece [{lo}, {hi}) at {at} is not inside "
                                 f"[0, {self.numel}]")

    @property
    def owned_numel(self) -> int:
        """Shard positions ``[0, n)`` holding the owned elements (and padding between)."""
        return owned_numel(self.owned)


def into_main_grad(param: torch.Tensor) -> None:
    """Move ``param.grad`` into ``param.main_grad`` (+= in main_grad's dtype)."""
    if param.grad is None:  # another hook moved it already
        return
    param.main_grad.add_(param.grad)
    param.grad = None
