"""Staged accumulation of an ODC group: ``scatter_accumulate`` adds the contribution into a
private fp32 staging buffer (one per accumulator view); ``sync`` applies the staged
buffers at every owner in source rank order, so sums are bitwise reproducible. Used in
deterministic mode, and for CUDA inputs when some pair of GPUs lacks native peer atomics
(:mod:`~odc_pp.odc.transport_cuda`; the adds at sync are then plain stores, one source at
a time).

GPU cost: staging is ``buffer.add_(input)`` on the caller's current stream, with no host
synchronisation per push; the sync applies each owner's slices in one batch on the push
stream and waits once per owner (the turn may pass only after the adds landed), so a
deterministic sync costs ``world_size`` host waits, not one per pushed gradient.

Ordering (the contract in :mod:`odc_pp.odc.transport_path`): the adds of sync k reach an
owner only after the owner entered sync k, so its own writes before that sync (zeroing
its accumulator after the optimizer step, in-place clipping) are never lost to a source's
read-modify-write.

* Every member on this host: turn-taking on the owners' control-block counters
  (``HostGroup.open_turns`` / ``take_turn`` / ``pass_turn``): an owner opens its counter
  for sync k once its own writes are complete, then sources 0, 1, ... add in turn.
* Some member on another host: every source sends each owner its staged slices over the
  cross-host link and each owner applies what it receives itself, in source rank order,
  inside its own sync.

Memory: a staging buffer exists only while it holds contributions, from the first
``stage`` into an accumulator view after a sync to the next sync, which frees it (fp32,
4 bytes per element of the staged input; see :mod:`odc_pp.planner.memory`).
Buffers that received nothing since the previous sync are not applied (nothing to add);
every member still takes its turns, so the counters stay in step. The turn epochs count
this object's applies (1, 2, ...), so a staged accumulation made after some syncs (the
group creates one at its first CUDA allocation without native atomics, collectively)
starts its counters at the beginning like every other member's.

Release: :meth:`StagedAccumulation.drop` forgets the staging buffers of an allocation the
group releases (their contributions since the last sync are discarded), so no later sync
adds into freed memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from odc_pp import _C
from odc_pp.odc.transport_host import Allocation, HostPath, Locator, dtype_code
from odc_pp.odc.transport_path import shard_range

__all__ = ["StagedAccumulation"]


@dataclass(kw_only=True)
class _Staging:
    allocation: Allocation
    """The symmetric allocation the accumulator view belongs to."""
    buffer: torch.Tensor
    """The size of the full input; sum of this rank's contributions since sync (fp32, or
    a borrowed input's dtype)."""
    dirty: bool = False
    """Whether anything was staged since the previous sync."""
    borrowed: bool = False
    """The buffer is the caller's retained input (``stage(retain=True)``), not ours."""


class StagedAccumulation:
    """Staged contributions of one rank and their ordered application at sync.

    ``host`` is the group's ``odc_pp._C.HostGroup`` (turn counters), ``host_path`` adds CPU
    buffers, ``cuda_path`` (a callable returning the CUDA path, made on first use) adds
    and stages GPU buffers, ``cross_host`` (a CrossHostPath or None) carries the ordered
    exchange, ``apply_own(alloc_id, offset, data)`` adds fp32 data into this rank's memory.
    """

    def __init__(self, *, rank: int, world_size: int, locate: Locator, host,
                 host_path: HostPath, cuda_path, cross_host, apply_own, num_threads: int):
        self.rank = rank
        self.world_size = world_size
        self.host = host
        self.host_path = host_path
        self.cuda_path = cuda_path
        self.cross_host = cross_host
        self.apply_own = apply_own
        self.num_threads = num_threads
        self._locate = locate
        self._staged: dict[tuple[int, int, int], _Staging] = {}
        self._applies = 0

    def stage(self, accumulator: torch.Tensor, input: torch.Tensor, *,
              retain: bool = False) -> None:
        """staging(accumulator view) += input; complete on return. ``retain``: the caller
        leaves ``input`` unchanged until the next sync, so the first contribution since
        the sync becomes the staging buffer itself, in its own dtype (no copy; nothing else
        may be staged into that view before the sync)."""
        allocation, offset = self._locate(accumulator, "accumulator")
        flat = input.view(-1)
        key = (allocation.alloc_id, offset, flat.numel())
        if retain and key not in self._staged:
            self._staged[key] = _Staging(allocation=allocation, buffer=flat, dirty=True,
                                         borrowed=True)
            return
        if key in self._staged and self._staged[key].borrowed:
            raise RuntimeError("a retained contribution is the staging buffer of this "
                               "accumulator until the sync: stage nothing else into it")
        if key not in self._staged:
            self._staged[key] = _Staging(allocation=allocation, buffer=torch.zeros(
                flat.numel(), dtype=torch.float32, device=flat.device))
        staging = self._staged[key]
        staging.dirty = True
        if flat.is_cuda:
            staging.buffer.add_(flat)  # fp32 += (exactly converted) input, current stream
        else:
            _C.accumulate_local(staging.buffer.data_ptr(), flat.data_ptr(),
                                dtype_code(flat.dtype), flat.numel(), self.num_threads)

    def _dirty(self) -> list[tuple[tuple[int, int, int], _Staging]]:
        return sorted(((key, staging) for key, staging in self._staged.items()
                       if staging.dirty), key=lambda item: item[0])

    def drop(self, alloc_id: int) -> None:
        """Forget the staging buffers of allocation ``alloc_id`` (it is being released)."""
        for key in [key for key in self._staged if key[0] == alloc_id]:
            del self._staged[key]

    def apply(self) -> None:
        """Land every staged contribution of every member (call on every member at every
        sync, after this rank's own writes are complete, i.e. after the paths' flush)."""
        items = self._dirty()
        self._applies += 1
        if self.cross_host is not None:
            self._apply_ordered(items)
        else:
            self._apply_turns(self._applies, items)
        for key, _ in items:  # sized by what is pending: made again at the next stage
            del self._staged[key]

    def staged_bytes(self) -> int:
        """Bytes of the staging buffers held now (contributions awaiting a sync; borrowed
        buffers are the caller's)."""
        return sum(s.buffer.numel() * s.buffer.element_size() for s in self._staged.values()
                   if not s.borrowed)

    def _apply_turns(self, epoch: int, items) -> None:
        self.host.open_turns(epoch)  # our own writes are complete: sources may add
        for owner in range(self.world_size):
            self.host.take_turn(owner, epoch)
            on_gpu = []
            for (_, offset, numel), staging in items:
                start, end = shard_range(numel, owner, self.world_size)
                if end <= start:
                    continue
                source = staging.buffer[start:end]
                if source.is_cuda:
                    on_gpu.append((staging.allocation, offset, source))
                else:
                    self.host_path.add_now(owner, staging.allocation, offset, source)
            if on_gpu:
                self.cuda_path().add_many(owner, on_gpu)  # landed on return
            self.host.pass_turn(owner, epoch)

    def _apply_ordered(self, items) -> None:
        outgoing = {}
        for owner in range(self.world_size):
            meta, data = [], []
            for (alloc_id, offset, numel), staging in items:
                start, end = shard_range(numel, owner, self.world_size)
                if end > start:
                    meta += [alloc_id, offset, end - start]
                    data.append(staging.buffer[start:end].float())  # the wire is fp32
            outgoing[owner] = (torch.tensor(meta, dtype=torch.int64),
                               torch.cat(data) if data else torch.zeros(0))

        def apply(source, meta, data):
            position = 0
            for alloc_id, offset, count in meta.view(-1, 3).tolist():
                self.apply_own(alloc_id, offset, data[position:position + count])
                position += count

        self.cross_host.exchange_ordered(outgoing, apply)
