"""The ``module_hooks`` driver of :class:`~odc_pp.odc.engine.ShardedDataParallel`: plain
``nn.Module`` training without the pipeline runtime.

Forward pre-hooks gather a unit (and prefetch the next), forward post-hooks release it
(unless ``keep_params_through_backward``) and register a gradient hook on the unit's output
that gathers it again for backward; per-parameter post-accumulate hooks push the unit's
gradients as soon as all of them exist. In collective mode every microbatch's collectives
are checked against the canonical order that padding of shorter replicas replays.

A mixin: it uses the engine's units, ``_gather``/``_prefetch``/``_release``/``_push`` and
state (``_handles``, ``_ops``, ``_local_microbatches``, ``config``).
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten

from .flat_unit import FlatUnit

__all__ = ["ModuleHooksDriver"]


class ModuleHooksDriver:
    """The module-hooks half of ``ShardedDataParallel`` (see the module docstring)."""

    def _attach_module_hooks(self) -> None:
        for unit in self.units:
            self._handles.append(unit.module.register_forward_pre_hook(
                self._make_forward_pre_hook(unit)))
            self._handles.append(unit.module.register_forward_hook(
                self._make_forward_post_hook(unit)))
            for position, param in enumerate(unit.params):
                self._handles.append(param.register_post_accumulate_grad_hook(
                    self._make_accumulated_hook(unit, position)))

    def detach_hooks(self) -> None:
        """Remove the module hooks (module_hooks driver)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _make_forward_pre_hook(self, unit: FlatUnit):
        def hook(module, args):
            if unit.index == 0 and torch.is_grad_enabled():
                self._start_microbatch()
            self._gather(unit)
            self._prefetch(unit.index + 1)
        return hook

    def _make_forward_post_hook(self, unit: FlatUnit):
        def hook(module, args, output):
            if not torch.is_grad_enabled():
                self._release(unit)
                return output
            if not self.config.keep_params_through_backward:
                self._release(unit)
                tensors = [t for t in tree_flatten(output)[0]
                           if isinstance(t, torch.Tensor) and t.requires_grad]
                if not tensors:
                    raise ValueError(f"unit {unit.index} returned no tensor that requires "
                                     f"grad; keep_params_through_backward=False needs one to "
                                     f"gather the unit again before its backward")
                torch.autograd.graph.register_multi_grad_hook(
                    tensors, lambda grads: self._gather_for_backward(unit), mode="any")
            return output
        return hook

    def _gather_for_backward(self, unit: FlatUnit) -> None:
        self._gather(unit)
        self._prefetch(unit.index - 1)

    def _make_accumulated_hook(self, unit: FlatUnit, position: int):
        def hook(param):
            unit.accumulated.add(position)
            if len(unit.accumulated) == len(unit.params):
                self._push(unit)
                self._release(unit)
        return hook

    def _start_microbatch(self) -> None:
        if self.config.mode.is_collective and self.config.check_collective_order:
            self._check_ops()
        self._local_microbatches += 1
        self._ops = []

    def _canonical_ops(self) -> list[tuple[str, int]]:
        """Collectives of one training microbatch under the module_hooks driver."""
        forward = [("G", u.index) for u in self.units]
        if self.config.keep_params_through_backward:
            backward = [("S", u.index) for u in reversed(self.units)]
        else:
            backward = [op for u in reversed(self.units) for op in (("G", u.index),
                                                                    ("S", u.index))]
        return forward + backward

    def _check_ops(self) -> None:
        if self.config.unit_driver != "module_hooks" or self._local_microbatches == 0:
            return
        if self._ops != self._canonical_ops():
            raise RuntimeError(
                f"collective mode: microbatch {self._local_microbatches - 1} issued "
                f"{self._ops}, not the canonical {self._canonical_ops()} that padding of "
                f"shorter replicas replays; every unit must run forward once and backward "
                f"once per microbatch, in order")
