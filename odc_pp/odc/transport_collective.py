"""Collective backend of the ODC API: all-gather and reduce-scatter through torch.distributed.

The baseline and the fallback. Unlike the one-sided backend, every member must call
``scatter_accumulate`` the same number of times between two ``sync`` calls (each call is a
reduce-scatter every member takes part in); ``sync`` checks the counts and raises a
ValueError naming the ranks that disagree. :class:`CollectivePath` is this backend as a
transport path (see the contract in :mod:`odc_pp.odc.transport_path`): one path for every
member, no one-sided get/put.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from odc_pp.odc.transport_host import drain, wait_all
from odc_pp.odc.transport_path import Work, shard_range

__all__ = ["gather_collective", "reduce_scatter_accumulate", "check_call_counts",
           "CollectivePath"]


def _padded(tensor: torch.Tensor, total: int, dtype: torch.dtype) -> torch.Tensor:
    flat = tensor.reshape(-1).to(dtype)
    if flat.numel() == total:
        return flat.contiguous()
    padded = torch.zeros(total, dtype=dtype, device=tensor.device)
    padded[:flat.numel()] = flat
    return padded


def gather_collective(output: torch.Tensor, shard: torch.Tensor, process_group) -> None:
    world_size = dist.get_world_size(process_group)
    shard_size = shard.numel()
    flat_output = output.view(-1)
    if flat_output.numel() == shard_size * world_size:
        dist.all_gather_into_tensor(flat_output, shard.reshape(-1), group=process_group)
        return
    full = torch.empty(shard_size * world_size, dtype=output.dtype, device=output.device)
    dist.all_gather_into_tensor(full, shard.reshape(-1), group=process_group)
    flat_output.copy_(full[:flat_output.numel()])


def reduce_scatter_accumulate(accumulator: torch.Tensor, input: torch.Tensor, process_group,
                              valid: int):
    """Starts the reduce-scatter; returns (work, finish) where finish() adds the result
    (first `valid` elements) into the (fp32) accumulator once the work is done.

    The reduce-scatter runs in ``input``'s dtype: the bytes the one-sided backend pushes
    (a bf16 gradient travels as bf16 there too), so the collective baseline moves the same
    volume; as megatron's default (no ``--accumulate-allreduce-grads-in-fp32``), the sum
    over ranks is then rounded to that dtype, where the one-sided backend adds each
    contribution into fp32."""
    world_size = dist.get_world_size(process_group)
    shard_size = accumulator.numel()
    padded = _padded(input, shard_size * world_size, input.dtype)
    result = torch.empty(shard_size, dtype=input.dtype, device=accumulator.device)
    work = dist.reduce_scatter_tensor(result, padded, group=process_group, async_op=True)

    def finish() -> None:
        flat = accumulator.view(-1)
        flat[:valid].add_(result[:valid])

    return work, finish


def check_call_counts(count: int, rank: int, process_group) -> None:
    counts = [None] * dist.get_world_size(process_group)
    dist.all_gather_object(counts, count, group=process_group)
    if len(set(counts)) > 1:
        raise ValueError(
            f"collective backend: members called scatter_accumulate different numbers of times "
            f"since the last sync (per group rank: {counts}); the collective backend needs equal "
            f"counts, use TransportConfig(backend='odc') for uneven calls")


class CollectivePath:
    """Every member through all-gather / reduce-scatter on ``process_group``. An add lands
    in this rank's own accumulator when its reduce-scatter finished and the result was
    added (at ``Work.wait`` or ``flush``); the barrier checks that every member issued the
    same number of scatter_accumulate calls since the previous one."""

    def __init__(self, process_group, rank: int, world_size: int):
        self.process_group = process_group
        self.rank = rank
        self.world_size = world_size
        self.peers = list(range(world_size))
        self._pending: list[Work] = []
        self._calls = 0

    def gather(self, output: torch.Tensor, shard: torch.Tensor) -> None:
        gather_collective(output, shard, self.process_group)

    def scatter_accumulate(self, accumulator: torch.Tensor, input: torch.Tensor) -> Work:
        self._calls += 1
        start, end = shard_range(input.numel(), self.rank, self.world_size)
        work, finish = reduce_scatter_accumulate(accumulator, input, self.process_group,
                                                 end - start)

        def wait(timeout):
            work.wait()
            finish()

        handle = Work(waiter=wait)
        self._pending.append(handle)
        return handle

    def get(self, output: torch.Tensor, remote: torch.Tensor, peer: int) -> None:
        raise ValueError("get is one-sided and needs TransportConfig(backend='odc')")

    def put(self, remote: torch.Tensor, input: torch.Tensor, peer: int) -> Work:
        raise ValueError("put is one-sided and needs TransportConfig(backend='odc')")

    def flush(self) -> None:
        pending, self._pending = self._pending, []
        wait_all(pending)

    def barrier(self, epoch: int) -> None:
        calls, self._calls = self._calls, 0
        check_call_counts(calls, self.rank, self.process_group)

    def close(self) -> None:
        pending, self._pending = self._pending, []
        drain(pending)
