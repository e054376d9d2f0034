"""Regression test of the forced cross-host (gloo point-to-point) path under the traffic an
engine produces: several symmetric allocations of different sizes, gathers on the main
thread while another thread issues scatter_accumulates, checked against torch.distributed
collectives. Requests of one rank and replies/payloads of another used to share tags on
the same (source, destination) pair, so a receive could match a message of another size
(gloo "op.preamble.length <= op.nbytes") or, worse, of the same size (silently wrong data)."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.distributed as dist

from odc_pp.odc import primitives as odc

from odc_pp.testing.launch import LaunchConfig, run_workers

pytestmark = pytest.mark.multiproc

NUMELS = [1037, 4099, 24_999]  # different sizes, none a multiple of the world size
ROUNDS = 3


def _shard_values(rank: int, index: int, shard_size: int) -> torch.Tensor:
    return torch.arange(shard_size, dtype=torch.float32) * (index + 1) + 1000 * rank


def _contribution(rank: int, round_: int, index: int, numel: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(10_000 * rank + 100 * round_ + index)
    return torch.randn(numel, generator=generator)


def _scatter_rounds(group, accumulators, rank, errors) -> None:
    """Runs on a second thread: rank-dependent numbers of scatter_accumulates."""
    try:
        works = []
        for round_ in range(ROUNDS + rank):
            for index, numel in enumerate(NUMELS):
                works.append(odc.scatter_accumulate(
                    accumulators[index], _contribution(rank, round_, index, numel), group))
        for work in works:
            work.wait(timeout=60)
    except BaseException as error:  # noqa: BLE001 - re-raised on the main thread
        errors.append(error)


def _run_concurrent(rank, world, results):
    group = odc.new_group(config=odc.TransportConfig(timeout_s=30, force_cross_host=True))
    assert group.cross_host is not None
    shard_sizes = [-(-numel // world) for numel in NUMELS]
    # interleave parameter and accumulator allocations, as an engine's buckets do
    shards, accumulators = [], []
    for index, size in enumerate(shard_sizes):
        shards.append(odc.symmetric_empty(size, torch.float32, group))
        accumulators.append(odc.symmetric_empty(size + 5, torch.float32, group)[2:2 + size])
        shards[-1].copy_(_shard_values(rank, index, size))
        accumulators[-1].zero_()
    odc.sync(group)
    dist.barrier()

    errors: list[BaseException] = []
    scatterer = threading.Thread(target=_scatter_rounds, args=(group, accumulators, rank, errors))
    scatterer.start()
    gathered = []
    for _ in range(ROUNDS):
        for index, numel in enumerate(NUMELS):
            output = torch.full((numel,), float("nan"))
            odc.gather_into_tensor(output, shards[index], group)
            gathered.append((index, output))
    scatterer.join(timeout=120)
    assert not scatterer.is_alive(), "scatter_accumulate thread hung"
    if errors:
        raise errors[0]
    odc.sync(group)
    dist.barrier()

    for index, output in gathered:
        reference = torch.empty(shard_sizes[index] * world)
        dist.all_gather_into_tensor(reference, shards[index].clone())
        assert torch.equal(output, reference[:NUMELS[index]]), f"gather of allocation {index}"
    for index, numel in enumerate(NUMELS):
        local_sum = torch.zeros(shard_sizes[index] * world)
        for round_ in range(ROUNDS + rank):
            local_sum[:numel] += _contribution(rank, round_, index, numel)
        reduced = torch.empty(shard_sizes[index])
        dist.reduce_scatter_tensor(reduced, local_sum)
        start, end = odc.shard_range(numel, rank, world)
        torch.testing.assert_close(accumulators[index][:end - start], reduced[:end - start],
                                   rtol=1e-5, atol=1e-5, msg=f"accumulator {index}")
    group.destroy()
    return True


@pytest.mark.parametrize("world_size", [3])
def test_cross_host_concurrent_gather_and_scatter(world_size):
    values = run_workers(_run_concurrent, world_size,
                         config=LaunchConfig(pass_queue=True, timeout_s=120))
    assert all(values[rank] for rank in range(world_size))
