"""Collective backend of the ODC API: all-gather and reduce-scatter through torch.distributed.

The baseline and the fallback. Unlike the one-sided backend, every member must call
``scatter_accumulate`` the same number of times between two ``sync`` calls (each call is a
reduce-scatter every member takes part in); ``sync`` checks the counts and raises a
ValueError naming the ranks that disagree.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["gather_collective", "reduce_scatter_accumulate", "check_call_counts"]


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
    (first `valid` elements) into the accumulator once the work is done."""
    world_size = dist.get_world_size(process_group)
    shard_size = accumulator.numel()
    padded = _padded(input, shard_size * world_size, torch.float32)
    result = torch.empty(shard_size, dtype=torch.float32, device=accumulator.device)
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
