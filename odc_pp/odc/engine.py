"""ODC sharded data parallelism: parameters sharded over data-parallel ranks, gathered on
demand, gradients scatter-accumulated to their owners, one synchronisation per minibatch.

Layout. The model is cut into *units* (a list of modules: transformer blocks, or pipeline
chunks). Each unit's trainable parameters are flattened, in ``module.parameters()`` order,
into one flat buffer of ``numel`` elements. Data-parallel rank r owns elements
``shard_range(numel, r, world)`` of it (``param_residency='layer'``: about ``1/world`` of
every layer, :mod:`odc_pp.odc.shard_map`) and keeps them in two symmetric tensors of
``S = ceil(numel / world)`` elements (a little more with layer residency's padding): the
parameter shard (compute dtype; peers read it) and the gradient accumulator (fp32; peers
add into it). The optimizer
(:class:`~odc_pp.odc.sharded_optimizer.ShardedAdamW`) updates only the owned shard.

Parameters. Every parameter's ``.data`` is a view into a buffer of its unit's *segment*
(the whole unit, or with ``param_residency='layer'`` one transformer layer: see
:mod:`odc_pp.odc.residency`) whose storage is released (resized to zero bytes) between
uses and re-filled from the owners' shards before use. Autograd keeps referring to the same tensors, so a gather before backward makes
saved weights valid again. Do not read a released parameter; use :meth:`gathered`.

Gradients. Where a microbatch's weight gradients go (``grad_accumulation``):
* ``push``: after a unit's weight gradients of one microbatch are complete (``.grad``, the
  compute dtype), they are flattened and ``scatter_accumulate``-d into the owners' fp32
  accumulators, and ``.grad`` is reset to None;
* ``local`` (pipeline driver; ``auto`` picks it at dp=1 and in deterministic groups, which
  stage every push in an fp32 buffer of the whole unit anyway): each parameter has a
  ``main_grad`` view (fp32, or bf16 with ``main_grad_dtype``) of its unit's local accumulator; deferred W adds into it, and a
  post-accumulate hook moves what autograd puts in ``.grad`` there at once. At dp=1 the
  local accumulator is the owner's accumulator itself; at dp > 1 it is pushed once, at
  :meth:`finish_minibatch`, staged by reference. Memory: one fp32 gradient of the stage
  and no compute-dtype copy, Megatron's ``main_grad`` layout.
Gradients are *summed* over ranks and microbatches, never averaged: the caller scales
the loss (e.g. by the global minibatch's token count, known from the load-balancing plan).

At dp=1 a unit's gathered parameters are its shard (one compute-dtype copy, never
released or gathered).

Drivers.
* ``unit_driver="module_hooks"`` (any ``nn.Module`` stack): forward pre-hooks gather a unit,
  forward post-hooks release it (unless ``keep_params_through_backward``), a gradient hook on
  the unit's output gathers it again for backward, and per-parameter post-accumulate hooks
  push the unit's gradients as soon as all of them exist. Call :meth:`finish_minibatch`
  after the last backward of the minibatch.
* ``unit_driver="pipeline"``: the pipeline runtime calls the
  :class:`~odc_pp.runtime.hooks.StageDataParallel` methods; units are the local chunks. A
  chunk is gathered at its first use in a minibatch and stays gathered until the optimizer
  step (a W action may still need the chunk's parameters after another chunk ran); the
  weight gradients of (chunk, microbatch) are pushed right after its W (or BW), or
  accumulated locally (above).

Modes. ``odc``: one-sided transport; replicas may run different numbers of microbatches.
``collective``: the same code with an all-gather / reduce-scatter transport (the FSDP
baseline); every call is a collective, so replicas with fewer microbatches replay the
communication of the missing microbatches with zero gradients at :meth:`finish_minibatch`
(pass ``max_microbatches`` to :meth:`begin_minibatch`). ``hierarchical``: ``group`` is the
ranks of one host (ODC), and after the per-minibatch sync the owned accumulators are
all-reduced over ``inter_host_group`` (the ranks with the same local rank on other hosts),
like HSDP.

Prefetch. With the module_hooks driver in odc / hierarchical modes the next unit (the
previous one in backward) is gathered while the current one computes. CPU: on a helper
thread. CUDA: issued from the compute stream (the calling thread's current stream) as an
async gather on the transport's gather stream, which first waits for the compute queued
so far; the compute stream waits for the copies only when the unit is needed (no helper
thread, so no thread ever touches another GPU or a default stream).

Determinism. Summation order is the transport's business: make the group with
``TransportConfig(deterministic=True)`` and two runs give bitwise-identical results (the
engine issues everything in program order).

Tied parameters across units or ranks (:meth:`tie`; e.g. an embedding and its output-layer
copy on another pipeline stage). After the minibatch's sync, :meth:`finish_minibatch`
sums the copies' accumulated gradients over the ``tie`` group, each element taken once
from its owner, and writes the sum back into every copy's owned range: the copies get the
same gradient and (elementwise AdamW) the same update, so they stay bitwise equal.

Synchronisation. :meth:`finish_minibatch` waits for this rank's pushes and calls ``sync``
once; after it every owner's accumulator is final. After the optimizer step,
:meth:`finish_step` zeroes the accumulators and calls ``sync`` again so that no peer reads a
parameter shard before its owner has written it. No other waits happen between ranks.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Iterator, Sequence

import torch
import torch.distributed as dist
from torch import nn

from . import primitives as prim
from .engine_config import OdcConfig, UnitLayout, accumulates_locally, into_main_grad
from .flat_unit import FlatUnit
from .module_hooks import ModuleHooksDriver
from .residency import LayerResidency, Segment, gather_segment
from .tied import TiedGradients

__all__ = ["OdcConfig", "ShardedDataParallel", "UnitLayout", "accumulates_locally"]


class ShardedDataParallel(ModuleHooksDriver):
    """Shards ``modules`` (the units) over the data-parallel ``group`` (an ``OdcGroup`` from
    :func:`odc_pp.odc.primitives.new_group`).

    ``process_group`` is the torch.distributed group of the same ranks (used for the
    gradient-norm all-reduce and checkpoint barriers; None: the default group).
    ``inter_host_group`` (hierarchical mode only) connects this rank with the ranks of the
    same local rank on the other hosts. Every replica must construct the units with
    identical initial parameters (same seed); each keeps only its own shard.
    """

    def __init__(self, modules: Sequence[nn.Module], config: OdcConfig, group, *,
                 process_group: dist.ProcessGroup | None = None,
                 inter_host_group: dist.ProcessGroup | None = None,
                 layers: Sequence[Sequence[nn.Module]] | None = None) -> None:
        self.config = config
        self.group = group
        self.process_group = process_group
        self.inter_host_group = inter_host_group
        self._check_group(group, inter_host_group)
        if not modules:
            raise ValueError("ShardedDataParallel needs at least one module (unit)")
        self.units: list[FlatUnit] = []
        seen: set[int] = set()
        per_layer = config.param_residency == "layer"
        if per_layer and (layers is None or len(layers) != len(modules)):
            raise ValueError("param_residency='layer' needs layers: the modules gathered "
                             "per use, one list per unit")
        for index, module in enumerate(modules):
            self.units.append(self._build_unit(index, module, seen,
                                               layers[index] if per_layer else ()))
        # Peers read our shards and add into our accumulators one-sidedly: nobody may start
        # before every member has filled its shards and zeroed its accumulators.
        prim.sync(group)
        self._pending: list[tuple[list, torch.Tensor]] = []  # (a push's Works, its input)
        self._handles: list = []
        self._max_microbatches: int | None = None
        self._local_microbatches = 0
        self._ops: list[tuple[str, int]] = []
        self._tied: TiedGradients | None = None
        self._prefetching = (config.prefetch and not config.mode.is_collective
                             and config.unit_driver == "module_hooks")
        self._prefetcher = None  # the CPU helper thread; CUDA units need none
        if self._prefetching and any(not unit.param_shard.is_cuda for unit in self.units):
            self._prefetcher = ThreadPoolExecutor(1, thread_name_prefix="odc-prefetch")
        if config.unit_driver == "module_hooks":
            self._attach_module_hooks()
        self._layer_residency = LayerResidency(
            self.units, lambda unit, segment: self._gather_segment(unit, segment),
            self._release_segment, self._prefetch_segment if config.prefetch and not config.mode.is_collective
            else None) if per_layer else None
        self._grad_hooks: list = []
        self.local_grads = accumulates_locally(config, dp=group.world_size,
                                               deterministic=group.config.deterministic)
        """Weight gradients go into each unit's ``main_grad`` (grad_accumulation)."""
        if self.local_grads:
            for unit in self.units:
                self._attach_main_grad(unit)

    # ----- construction ----------------------------------------------------------------
    def _check_group(self, group, inter_host_group) -> None:
        backend = group.config.backend
        mode = self.config.mode
        wanted = mode.transport
        if backend != wanted:
            raise ValueError(f"mode={mode.value!r} needs an OdcGroup made with "
                             f"TransportConfig(backend={wanted!r}), got backend={backend!r}")
        if mode.is_hierarchical != (inter_host_group is not None):
            raise ValueError("pass inter_host_group exactly when mode='hierarchical'")

    def _build_unit(self, index: int, module: nn.Module, seen: set[int],
                    layers: Sequence[nn.Module]) -> FlatUnit:
        names, params = [], []
        for name, param in module.named_parameters():
            if not param.requires_grad:
                continue  # frozen parameters stay replicated and untouched
            if id(param) in seen:
                raise ValueError(f"parameter {name!r} of unit {index} also belongs to an "
                                 f"earlier unit; tied parameters must live in one unit")
            seen.add(id(param))
            names.append(name)
            params.append(param)
        if not params:
            raise ValueError(f"unit {index} ({type(module).__name__}) has no trainable "
                             f"parameters; leave it out of the unit list")
        device = params[0].device
        unit = FlatUnit(index, module, params, names, self.group, self.config.torch_param_dtype,
                     device, layers)
        with torch.no_grad():
            for param, offset in zip(params, unit.offsets):
                unit.flat(offset, param.numel()).copy_(param.detach().reshape(-1))
            if not unit.aliased:
                unit.param_shard.zero_()
                full = torch.cat([unit.flat(offset, param.numel())
                                  for param, offset in zip(params, unit.offsets)])
                for lo, hi, at in unit.owned:
                    unit.param_shard[at:at + hi - lo].copy_(full[lo:hi])
                del full
            unit.grad_acc.zero_()
            unit.point_params()
            for param in params:
                param.grad = None
        self._release(unit)
        return unit

    def _attach_main_grad(self, unit: FlatUnit) -> None:
        """``param.main_grad``: the parameter's slice of the unit's local accumulator (fp32
        or ``main_grad_dtype``; at dp=1 the owner's fp32 accumulator). Deferred W
        (``odc_pp.megatron.layers.accumulate_weight_grad``) adds into it; a
        post-accumulate hook moves whatever autograd puts in ``.grad`` there at once."""
        unit.main_grad = self._new_main_grad(unit)
        for param, offset, shape in zip(unit.params, unit.offsets, unit.shapes):
            param.main_grad = unit.main_grad[offset:offset + param.numel()].view(shape)
            self._grad_hooks.append(param.register_post_accumulate_grad_hook(into_main_grad))

    def _new_main_grad(self, unit: FlatUnit) -> torch.Tensor:
        """The unit's zeroed local accumulator (at dp=1 the owner's accumulator)."""
        dtype = getattr(torch, self.config.main_grad_dtype)
        return (unit.grad_acc[:unit.numel] if unit.aliased else
                torch.zeros(unit.numel, dtype=dtype, device=unit.param_shard.device))

    # ----- gather / release / push -----------------------------------------------------
    def _gather(self, unit: FlatUnit, *, kept_only: bool = False) -> None:
        """Gather the unit's segments (``kept_only``: those not gathered per layer)."""
        if unit.aliased:
            return
        if unit.prefetch is not None:
            self._wait_prefetch(unit)
        for segment in unit.segments:
            if not (kept_only and segment.module is not None):
                self._gather_segment(unit, segment)

    def _gather_segment(self, unit: FlatUnit, segment: Segment) -> None:
        """Gather ``segment``, or wait for its gather issued ahead (``segment.pending``;
        CUDA: the current stream waits for every owner's copy)."""
        if segment.pending is not None:
            pending, segment.pending = segment.pending, None
            pending.wait()
        if not (segment.resident or unit.aliased):
            self._issue_segment(unit, segment, ahead=False)

    def _prefetch_segment(self, unit: FlatUnit, segment: Segment) -> None:
        """Issue ``segment``'s gather without waiting (layer residency's gather ahead)."""
        if not (segment.resident or unit.aliased):
            self._issue_segment(unit, segment, ahead=True)

    def _issue_segment(self, unit: FlatUnit, segment: Segment, *, ahead: bool) -> None:
        segment.buffer.untyped_storage().resize_(segment.nbytes)
        segment.pending = gather_segment(segment, unit.param_shard, unit.map, self.group,
                                         async_op=ahead)
        segment.resident = True
        self._ops.append(("G", unit.index))

    def _prefetch(self, index: int) -> None:
        """Start gathering unit ``index`` (no-op if resident): CPU on the helper thread,
        CUDA as an async gather ordered on the compute stream."""
        if not self._prefetching or not 0 <= index < len(self.units):
            return
        unit = self.units[index]
        if unit.resident or unit.aliased:
            return
        (segment,) = unit.segments  # the module_hooks driver: one segment per unit
        segment.buffer.untyped_storage().resize_(segment.nbytes)
        segment.resident = True  # usable once _gather has waited for unit.prefetch
        if segment.buffer.is_cuda:  # ordered on the compute stream; waited for on it
            unit.prefetch = prim.gather_into_tensor(segment.buffer, unit.param_shard,
                                                    self.group, async_op=True)
        else:
            unit.prefetch = self._prefetcher.submit(prim.gather_into_tensor, segment.buffer,
                                                    unit.param_shard, self.group)
        self._ops.append(("G", unit.index))

    def _wait_prefetch(self, unit: FlatUnit) -> None:
        pending, unit.prefetch = unit.prefetch, None
        if isinstance(pending, Future):
            # the transport's own waits time out and name the peer; this bounds the thread
            pending.result(timeout=2 * self.group.config.timeout_s)
        else:  # CUDA Work: the current (compute) stream waits for the gather's copies
            pending.wait()

    def _release(self, unit: FlatUnit) -> None:
        if unit.aliased:
            return
        if unit.prefetch is not None:
            self._wait_prefetch(unit)
        for segment in unit.segments:
            self._release_segment(unit, segment)

    @staticmethod
    def _release_segment(unit: FlatUnit, segment: Segment) -> None:
        if segment.pending is not None:  # its copies may still be writing the buffer
            pending, segment.pending = segment.pending, None
            pending.wait()
        if segment.resident and not unit.aliased:
            if not segment.buffer.untyped_storage().resizable():
                # e.g. .numpy() of a parameter pinned the storage: a fresh one, same values
                segment.buffer = segment.buffer.clone()
                unit.point_params()
            segment.buffer.untyped_storage().resize_(0)
            segment.resident = False

    def _push(self, unit: FlatUnit, flat_grad: torch.Tensor | None = None, *,
              retain: bool = False) -> None:
        if flat_grad is None:
            flat_grad = unit.flat_grad()
            unit.clear_grads()
        works = [prim.scatter_accumulate(accumulator, part, self.group, retain=retain)
                 for accumulator, part in unit.map.split(unit.grad_acc, flat_grad)]
        self._pending.append((works, flat_grad))
        unit.pushes += 1
        self._ops.append(("S", unit.index))
        self._reap_pushes()
        while len(self._pending) > self.config.max_inflight_pushes:
            _wait_all(self._pending.pop(0)[0])

    def _reap_pushes(self) -> None:
        """Drop the pushes whose Work completed (their flat gradients are free at once;
        ``wait`` on a completed Work returns at once or raises its error)."""
        still = []
        for works, flat_grad in self._pending:
            if all(work.is_completed() for work in works):
                _wait_all(works)
            else:
                still.append((works, flat_grad))
        self._pending = still

    def _wait_pushes(self) -> None:
        while self._pending:
            _wait_all(self._pending.pop(0)[0])

    # ----- pipeline driver (odc_pp.runtime.hooks.StageDataParallel) ----------------------
    def before_forward(self, chunk: int, microbatch: int) -> None:
        """Full parameters of local ``chunk`` are usable when this returns (layer
        residency: the kept segments; each layer's are gathered by its hooks)."""
        self._gather_for_action(self._unit(chunk), backward=False)

    def before_backward(self, chunk: int, microbatch: int) -> None:
        """Parameters of ``chunk`` are usable for B or BW when this returns."""
        self._gather_for_action(self._unit(chunk), backward=True)

    def _gather_for_action(self, unit: FlatUnit, *, backward: bool) -> None:
        if self._layer_residency is not None:  # the previous action is over
            self._layer_residency.start_action(unit, backward=backward)
        self._gather(unit, kept_only=self._layer_residency is not None)

    def after_weight_grad(self, chunk: int, microbatch: int) -> None:
        """Push the weight gradients of (chunk, microbatch) to their owners (local
        accumulation: they are in the unit's ``main_grad`` already)."""
        if self._layer_residency is not None:
            self._layer_residency.release_all()
        unit = self._unit(chunk)
        if not self.local_grads:
            self._push(unit)
        if chunk == 0:
            self._local_microbatches += 1

    def _unit(self, chunk: int) -> FlatUnit:
        if not 0 <= chunk < len(self.units):
            raise ValueError(f"chunk {chunk} outside 0..{len(self.units) - 1} (the units "
                             f"given to ShardedDataParallel)")
        return self.units[chunk]

    # ----- minibatch boundary ----------------------------------------------------------
    def begin_minibatch(self, *, max_microbatches: int | None = None,
                        num_microbatches: int | None = None) -> None:
        """Start a minibatch. Collective mode needs ``max_microbatches`` (the largest
        microbatch count of any replica, from the load-balancing plan) so replicas with
        fewer microbatches replay the missing collectives; ``num_microbatches`` (this
        replica's count) lets the pipeline driver reject unpaddable plans early."""
        if self.config.mode.is_collective:
            if max_microbatches is None:
                raise ValueError("collective mode: pass max_microbatches (the largest "
                                 "microbatch count over replicas) to begin_minibatch")
            if (self.config.unit_driver == "pipeline" and len(self.units) > 1
                    and num_microbatches is not None and num_microbatches != max_microbatches):
                raise ValueError(
                    "collective mode with several chunks per pipeline rank needs equal "
                    "microbatch counts on every replica (use equal_count_balance or odc mode)")
        self._max_microbatches = max_microbatches
        self._local_microbatches = 0
        self._ops = []
        for unit in self.units:
            unit.pushes = 0

    def finish_minibatch(self) -> None:
        """Wait for this rank's pushes and synchronise once with the group; afterwards the
        owned accumulators (:meth:`owned_grads`) hold the minibatch's summed gradients."""
        for unit in self.units:
            if self.local_grads:
                self._push_main_grad(unit)
            elif any(p.grad is not None for p in unit.params):
                self._push(unit)  # leftovers, e.g. a B that accumulated some weight grads
        if self.config.mode.is_collective:
            self._pad_collectives()
        for unit in self.units:
            if unit.prefetch is not None:  # peers may overwrite shards once we synced
                self._wait_prefetch(unit)
        if self._layer_residency is not None:
            self._layer_residency.release_all()  # (waits for gathers ahead)
        self._wait_pushes()
        prim.sync(self.group)
        if self.inter_host_group is not None:
            for unit in self.units:
                dist.all_reduce(unit.grad_acc[:unit.owned_numel], group=self.inter_host_group)
        if self._tied is not None:
            self._tied.sum()

    def _push_main_grad(self, unit: FlatUnit) -> None:
        """The minibatch's local gradient of ``unit`` to its owners, once. At dp=1 it
        is the owner's accumulator already. The accumulator stays untouched until the sync
        (zeroed in :meth:`finish_step`), so a staging transport keeps it by reference."""
        for param in unit.params:
            if param.grad is not None:  # set outside autograd's accumulation
                into_main_grad(param)
        if not unit.aliased:
            self._push(unit, unit.main_grad, retain=True)

    def tie(self, params: Sequence[tuple[int, str]], group: dist.ProcessGroup | None) -> None:
        """Tie ``params`` (``(unit index, parameter name in the unit)`` on this rank) to
        their copies on the other ranks of ``group`` (e.g. the data-parallel ranks of the
        first and of the last pipeline stage; None: all copies are here). The copies must
        start equal; their gradients are summed at :meth:`finish_minibatch`
        (:class:`~odc_pp.odc.tied.TiedGradients`). Every rank of ``group`` calls it."""
        self._tied = TiedGradients(self.units, params, group)

    def tied_difference(self, owned: Sequence[torch.Tensor]) -> float:
        """Max abs difference between the tied copies of :meth:`tie` (0.0: bitwise equal,
        and 0.0 where nothing is tied on this rank); ``owned``: per unit, the owned
        elements (e.g. the optimizer's master weights). Collective over the tie group."""
        return 0.0 if self._tied is None else self._tied.differing(owned)

    def _pad_collectives(self) -> None:
        if self._max_microbatches is None:
            raise ValueError("collective mode: call begin_minibatch(max_microbatches=...) "
                             "before the minibatch")
        if self.config.unit_driver == "module_hooks":
            if self.config.check_collective_order:
                self._check_ops()
            missing = self._max_microbatches - self._local_microbatches
            if missing < 0:
                raise ValueError(f"ran {self._local_microbatches} microbatches, more than "
                                 f"max_microbatches={self._max_microbatches}")
            for _ in range(missing):
                self._replay(self._canonical_ops())
            return
        for unit in self.units:
            self._replay([("G", unit.index)] if not unit.resident else [])
        for unit in self.units:
            if self.local_grads:
                continue  # one push per unit on every rank
            missing = self._max_microbatches - unit.pushes
            if missing < 0:
                raise ValueError(f"chunk {unit.index} pushed {unit.pushes} microbatches, more "
                                 f"than max_microbatches={self._max_microbatches}")
            self._replay([("S", unit.index)] * missing)

    def _replay(self, ops: list[tuple[str, int]]) -> None:
        """Issue ``ops`` with zero gradient contributions (collective padding)."""
        for kind, index in ops:
            unit = self.units[index]
            if kind == "G":
                self._release(unit)
                self._gather(unit)
                if self.config.unit_driver == "module_hooks":
                    self._release(unit)
            else:
                self._push(unit, torch.zeros(unit.numel, dtype=unit.param_shard.dtype,
                                             device=unit.param_shard.device))

    def finish_step(self) -> None:
        """After the optimizer wrote the owned parameter shards: zero the accumulators,
        drop the (now stale) gathered parameters and publish the new shards to the group."""
        for unit in self.units:
            unit.grad_acc.zero_()
            if unit.main_grad is not None and not unit.aliased:
                unit.main_grad.zero_()
            unit.clear_grads()
            self._release(unit)
        prim.sync(self.group)

    # ----- access ----------------------------------------------------------------------
    def layout(self) -> list[UnitLayout]:
        """Per unit: parameter names, shapes and offsets in the flat buffer, and this rank's
        owned range (the order of :meth:`owned_params` and of the optimizer's state)."""
        return [UnitLayout(index=unit.index, module=unit.module, names=tuple(unit.names),
                           shapes=tuple(unit.shapes), offsets=tuple(unit.offsets),
                           numel=unit.numel, owned=tuple(unit.owned))
                for unit in self.units]

    def owned_grads(self) -> list[torch.Tensor]:
        """Per unit, the fp32 accumulated gradient of the owned elements (a view)."""
        return [unit.grad_acc[:unit.owned_numel] for unit in self.units]

    def owned_params(self) -> list[torch.Tensor]:
        """Per unit, the owned parameter elements in compute dtype (a view)."""
        return [unit.param_shard[:unit.owned_numel] for unit in self.units]

    @contextlib.contextmanager
    def gathered(self) -> Iterator[None]:
        """All units gathered inside the block (collective: every rank must enter)."""
        for unit in self.units:
            self._gather(unit)
        try:
            yield
        finally:
            for unit in self.units:
                self._release(unit)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Full trainable parameters as ``{"<unit>.<name>": tensor}`` (fp32 copies)."""
        with self.gathered():
            return {f"{unit.index}.{name}": param.detach().float().clone()
                    for unit in self.units for name, param in zip(unit.names, unit.params)}

    def destroy(self) -> None:
        """Wait for outstanding work and remove hooks (the group is the caller's)."""
        for unit in self.units:
            if unit.prefetch is not None:
                self._wait_prefetch(unit)
        self._wait_pushes()
        self.detach_hooks()
        if self._layer_residency is not None:
            self._layer_residency.release_all()
            self._layer_residency.remove()
        for handle in self._grad_hooks:
            handle.remove()
        self._grad_hooks = []
        if self._prefetcher is not None:
            self._prefetcher.shutdown(wait=True)


def _wait_all(works) -> None:
    for work in works:
        work.wait()
