"""GPU tests of the ODC transport's CUDA IPC path: two processes sharing one GPU (or two
GPUs) gather and scatter-accumulate through cudaIpc handles; checked against gloo
collectives on CPU copies. Skipped without CUDA (see tests/conftest.py)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from odc_pp.odc import primitives as odc

from odc_pp.testing.launch import LaunchConfig, run_workers

pytestmark = [pytest.mark.gpu, pytest.mark.multiproc]


def _run_cuda(rank, world, results, deterministic, peer_atomics):
    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    group = odc.new_group(config=odc.TransportConfig(timeout_s=60, deterministic=deterministic,
                                                     peer_atomics=peer_atomics))
    for numel in (0, 1, 4099, 1 << 20):
        shard_size = -(-numel // world)
        backing = odc.symmetric_empty(shard_size + 1, torch.float32, group, device=device)
        shard = backing[1:]
        shard.copy_(torch.arange(shard_size, device=device, dtype=torch.float32) + 10 * rank)
        odc.sync(group)
        output = torch.zeros(numel, device=device)
        odc.gather_into_tensor(output, shard, group)
        full = torch.empty(shard_size * world)
        dist.all_gather_into_tensor(full, shard.cpu())
        assert torch.equal(output.cpu(), full[:numel])
        odc.sync(group)
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            shard.zero_()
            odc.sync(group)
            local_sum = torch.zeros(numel)
            for call in range(rank + 1):
                contribution = torch.randn(numel, generator=torch.Generator().manual_seed(
                    rank * 100 + call)).to(dtype)
                local_sum += contribution.float()
                odc.scatter_accumulate(shard, contribution.to(device), group)
            odc.sync(group)
            padded = torch.zeros(shard_size * world)
            padded[:numel] = local_sum
            reduced = torch.empty(shard_size)
            dist.reduce_scatter_tensor(reduced, padded)
            start, end = odc.shard_range(numel, rank, world)
            torch.testing.assert_close(shard[:end - start].cpu(), reduced[:end - start],
                                       rtol=1e-5, atol=1e-5)
            odc.sync(group)
        odc.symmetric_free(backing, group)  # collective: peers unmap, then the owner frees
    _check_put_get_cuda(group, device)
    _check_async_gather(group, device)
    group.destroy()
    return True


def _check_async_gather(group, device):
    """An async gather issued on a side stream's work is ordered after it, and wait()
    orders the current stream after the copies (no host block in between)."""
    rank, world = group.rank, group.world_size
    shard = odc.symmetric_empty(1 << 16, torch.float32, group, device=device)
    shard.fill_(rank + 1.0)
    odc.sync(group)
    output = torch.empty(world << 16, device=device)
    output.fill_(-1.0)  # queued on the current stream before the gather: must not win
    work = odc.gather_into_tensor(output, shard, group, async_op=True)
    work.wait()
    expected = torch.arange(1, world + 1, dtype=torch.float32).repeat_interleave(1 << 16)
    assert torch.equal(output.cpu(), expected)
    odc.sync(group)


def _check_put_get_cuda(group, device):
    """Ring: put into the right neighbour's buffer, get the left neighbour's."""
    rank, world = group.rank, group.world_size
    right, left = (rank + 1) % world, (rank - 1) % world
    for numel in (0, 4099):
        backing = odc.symmetric_empty(numel + 2, torch.float32, group, device=device)
        backing.zero_()
        remote = backing[1:1 + numel]
        odc.sync(group)
        odc.put(remote, torch.full((numel,), 1.0 + rank, device=device), right, group).wait(60)
        odc.sync(group)
        assert torch.equal(remote.cpu(), torch.full((numel,), 1.0 + left))
        assert not backing[0].item() and not backing[-1].item()
        fetched = torch.zeros(numel, device=device)
        odc.get(fetched, remote, left, group)
        assert torch.equal(fetched.cpu(), torch.full((numel,), 1.0 + (left - 1) % world))
        odc.sync(group)


@pytest.mark.parametrize("deterministic,peer_atomics",
                         [(False, "auto"), (True, "auto"), (False, "never")])
def test_cuda_ipc_matches_collectives(deterministic, peer_atomics):
    assert run_workers(_run_cuda, 2, deterministic, peer_atomics,
                       config=LaunchConfig(pass_queue=True, timeout_s=300)) == [True, True]
