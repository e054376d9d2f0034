"""Where a unit's gathered parameters live, and for how long (``OdcConfig.param_residency``).

A unit's flat parameter buffer is cut into *segments*, contiguous ranges of the flat order,
each with its own storage so that it can be released (resized to zero bytes) alone:

* ``minibatch`` residency: one segment, the whole unit, gathered at the unit's first use
  in a minibatch and kept until the optimizer step (a deferred W may run after another
  chunk; nothing is gathered twice). Memory: ``e * P`` per rank.
* ``layer`` residency (FSDP's per-layer gather and free, ``--odc-param-residency layer``):
  every module the caller names (the transformer layers; the embedding, whose backward
  reads no weight, as forward-only) is a segment of its own,
  gathered by a forward pre-hook and released by the forward post-hook, gathered again
  when the gradient of its output arrives (B needs the weights; W does not: it reads the
  saved input and output gradient only) and released once the gradient of its input is
  computed. The ranges between those modules (embedding, final norm, output layer, tied
  weights) are segments kept as in ``minibatch``. The next layer's gather (in B the
  previous one's) is issued ahead, while the current layer computes (CPU: on the
  transport's helper thread; CUDA: on its gather streams), every owner's copy issued before
  one wait (``OdcGroup.get_many``); an action issues its first layer's at its start.
  Memory: ``e * (P_kept + 2 * P_layer)`` at most (:attr:`LayerResidency.LIMIT` layers;
  an embedding gathered per use: ``e * (P_kept + P_embedding + P_layer)`` in F); each
  gathered layer costs one more read of ``P_layer`` elements per F and per B, three per
  microbatch with recompute.

Under ``layer`` residency each segment is sharded over all ranks on its own
(:mod:`odc_pp.odc.shard_map`), so a layer's gather reads about ``1/dp`` of it from every
rank. A segment covering a contiguously sharded unit is gathered with one
``gather_into_tensor``; any other with one-sided ``get``s of the owners' pieces (odc and
hierarchical modes: the owners do not take part, so ranks may differ in when they
gather).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from . import primitives as prim
from .shard_map import ShardMap

__all__ = ["Segment", "plan_segments", "gather_segment", "LayerResidency"]


@dataclass(eq=False, kw_only=True)
class Segment:
    """One separately releasable range ``[lo, hi)`` of a unit's flat parameter buffer."""

    lo: int
    """First flat element."""
    hi: int
    """One past the last flat element."""
    buffer: torch.Tensor
    """The range's gathered values (its own storage; the parameters are views of it)."""
    nbytes: int
    """Bytes of ``buffer`` when resident (0: it is the dp=1 shard, never released)."""
    module: nn.Module | None = None
    """The module whose use gathers it (layer residency); None: kept from first use in a
    minibatch to the step."""
    backward: bool = True
    """The module's backward reads its weights (gather again for B); False: forward only
    (an embedding: its weight gradient is a scatter of the output gradient)."""
    resident: bool = True
    """Its storage is allocated and (once ``pending`` is waited for) filled."""
    pending: prim.Work | None = None
    """A gather issued ahead of use (layer prefetch), not yet waited for."""

    @property
    def numel(self) -> int:
        return self.hi - self.lo


def plan_segments(params: Sequence[nn.Parameter], offsets: Sequence[int], numel: int,
                  modules: Sequence[nn.Module | tuple[nn.Module, bool]]
                  ) -> list[tuple[int, int, nn.Module | None, bool]]:
    """``(lo, hi, module, backward)`` ranges covering ``[0, numel)``: one per entry of
    ``modules`` (a module, or ``(module, its backward reads its weights)``; its trainable
    parameters must be contiguous in the flat order) and kept ranges (module None)
    between them."""
    where = {id(p): (offset, offset + p.numel()) for p, offset in zip(params, offsets)}
    ranges = []
    for entry in modules:
        module, backward = entry if isinstance(entry, tuple) else (entry, True)
        spans = [where[id(p)] for p in module.parameters() if id(p) in where]
        if not spans:
            continue
        lo, hi = min(s for s, _ in spans), max(e for _, e in spans)
        if sum(e - s for s, e in spans) != hi - lo:
            raise ValueError(f"{type(module).__name__}'s parameters are not contiguous in "
                             f"the unit's flat order; it cannot be a residency segment")
        ranges.append((lo, hi, module, backward))
    ranges.sort(key=lambda r: r[0])
    segments, position = [], 0
    for lo, hi, module, backward in ranges:
        if lo < position:
            raise ValueError("residency modules overlap: name each parameter once")
        if lo > position:
            segments.append((position, lo, None, True))
        segments.append((lo, hi, module, backward))
        position = hi
    if position < numel:
        segments.append((position, numel, None, True))
    return segments


def gather_segment(segment: Segment, shard: torch.Tensor, shard_map: ShardMap, group, *,
                   async_op: bool = False) -> prim.Work | None:
    """``segment.buffer`` = the flat buffer's ``[lo, hi)``, read from its owners
    (``shard_map``): the whole unit of a contiguous map with one ``gather_into_tensor``
    (blocking); otherwise every owner's pieces with ``get``s issued before one wait
    (``group.get_many``). ``async_op``: return that wait (the Work) instead of waiting;
    the buffer is not to be read before it."""
    if shard_map.contiguous and segment.lo == 0 and segment.hi == shard_map.numel:
        prim.gather_into_tensor(segment.buffer, shard, group)
        return None
    pieces = []
    for owner in range(group.world_size):
        for lo, hi, at in shard_map.owned_in(owner, segment.lo, segment.hi):
            output = segment.buffer[lo - segment.lo:hi - segment.lo]
            source = shard[at:at + hi - lo]
            if owner == group.rank:
                output.copy_(source)
            else:
                pieces.append((output, source, owner))
    work = group.get_many(pieces, async_op=async_op)
    return work if async_op else None


class LayerResidency:
    """The hooks of ``layer`` residency on one engine's units (module docstring).
    ``gather(unit, segment)`` / ``release(unit, segment)`` are the engine's;
    ``prefetch(unit, segment)`` (None: no gathering ahead) issues a segment's gather
    without waiting for it (the engine's ``gather`` waits for it at its use).

    Prefetch: when a layer is gathered for its forward, the next layer's gather is issued;
    for its backward (B, or the recompute inside it), the previous layer's (one that
    reads its weights in backward). At most :attr:`LIMIT` layer segments are resident: a
    gather ahead that would exceed it is issued when a layer is released. An action
    (:meth:`start_action`) issues its first layer's gather before the kept segments'."""

    LIMIT = 2
    """Layer segments resident at once: the one computing and the one gathered ahead."""

    def __init__(self, units, gather, release, prefetch=None) -> None:
        self.units = units
        self._gather = gather
        self._release = release
        self._prefetch = prefetch
        self._layers = {unit.index: [s for s in unit.segments if s.module is not None]
                        for unit in units}
        self._wanted: tuple | None = None  # a gather ahead deferred by LIMIT
        self._handles: list = []
        for unit in units:
            for position, segment in enumerate(self._layers[unit.index]):
                self._hook(unit, position, segment)

    def _hook(self, unit, position: int, segment: Segment) -> None:
        def before(module, args, kwargs):
            self._gather(unit, segment)
            backward = torch._C._current_graph_task_id() != -1  # a recompute inside B
            self.ahead(unit, position - 1 if backward else position + 1, backward=backward)
            if torch.is_grad_enabled() and segment.backward:
                inputs = _grad_tensors((args, kwargs))
                if inputs:  # its backward is done once its input's gradient exists
                    torch.autograd.graph.register_multi_grad_hook(
                        inputs, lambda grads: self._drop(unit, segment), mode="any")

        def after(module, args, output):
            self._drop(unit, segment)
            outputs = _grad_tensors(output) if torch.is_grad_enabled() and segment.backward \
                else []
            if outputs:  # B needs the weights again
                torch.autograd.graph.register_multi_grad_hook(
                    outputs, lambda grads: self._gather_for_backward(unit, position),
                    mode="any")

        self._handles.append(segment.module.register_forward_pre_hook(before,
                                                                      with_kwargs=True))
        self._handles.append(segment.module.register_forward_hook(after))

    def _gather_for_backward(self, unit, position: int) -> None:
        self._gather(unit, self._layers[unit.index][position])
        self.ahead(unit, position - 1, backward=True)

    def _resident(self) -> int:
        return sum(segment.resident for layers in self._layers.values() for segment in layers)

    def ahead(self, unit, position: int, *, backward: bool) -> None:
        """Issue the gather of ``unit``'s layer ``position`` ahead of its use (nothing if
        there is none, it is resident, or ``backward`` and its backward reads no weight;
        deferred while :attr:`LIMIT` layers are resident)."""
        layers = self._layers[unit.index]
        if self._prefetch is None or not 0 <= position < len(layers):
            return
        segment = layers[position]
        if segment.resident or (backward and not segment.backward):
            return
        if self._resident() >= self.LIMIT:
            self._wanted = (unit, segment)
            return
        self._wanted = None
        self._prefetch(unit, segment)

    def _drop(self, unit, segment: Segment) -> None:
        self._release(unit, segment)
        if self._wanted is not None and self._resident() < self.LIMIT:
            (wanted_unit, wanted), self._wanted = self._wanted, None
            if not wanted.resident:
                self._prefetch(wanted_unit, wanted)

    def _last(self, unit) -> int:
        """Position of ``unit``'s last layer whose backward reads its weights (-1: none)."""
        return max((i for i, s in enumerate(self._layers[unit.index]) if s.backward),
                   default=-1)

    def start_action(self, unit, *, backward: bool) -> None:
        """A new action (F, or B / BW) of ``unit`` begins: release what the last one left
        and issue the gather of the first layer it uses (it overlaps what computes before
        that layer: the embedding, or the output layer's and the loss's backward)."""
        self.release_all()
        self.ahead(unit, self._last(unit) if backward else 0, backward=backward)

    def release_all(self) -> None:
        """Release every layer segment (between actions nothing needs one: a backward whose
        input needs no gradient has no hook that would release it)."""
        self._wanted = None
        for unit in self.units:
            for segment in self._layers[unit.index]:
                self._release(unit, segment)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def _grad_tensors(tree) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0]
            if isinstance(t, torch.Tensor) and t.requires_grad]
