"""One-sided get and put (odc_pp.odc.primitives) between processes on gloo: every rank puts
into its right neighbour's buffer and gets from its left neighbour's, at odd offsets, for
several sizes and dtypes, over shared memory and over the forced cross-host path; the
expected bytes come from torch.distributed.all_gather_object. Bad arguments raise
ValueError."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from odc_pp.odc import primitives as odc

from odc_pp.testing.launch import LaunchConfig, run_workers

pytestmark = pytest.mark.multiproc

SIZES = [0, 1, 4099, 3 * 2**20 + 1]  # the last crosses the streaming-store threshold
DTYPES = [torch.float32, torch.bfloat16, torch.uint8]
OFFSET = 3  # views at an odd element offset into the symmetric buffer


def _pattern(rank: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    generator = torch.Generator().manual_seed(rank * 7919 + numel)
    return torch.randint(0, 120, (numel,), generator=generator).to(dtype)


def _check_put_then_get(group, numel, dtype):
    rank, world = group.rank, group.world_size
    right, left = (rank + 1) % world, (rank - 1) % world
    backing = odc.symmetric_empty(numel + OFFSET + 2, dtype, group)
    backing.fill_(0)
    remote = backing[OFFSET:OFFSET + numel]
    odc.sync(group)
    odc.put(remote, _pattern(rank, numel, dtype), right, group).wait(timeout=60)
    odc.sync(group)
    # my buffer holds what my left neighbour put; the guard elements around it are untouched
    assert torch.equal(remote, _pattern(left, numel, dtype)), (numel, dtype)
    assert not backing[:OFFSET].any() and not backing[OFFSET + numel:].any()
    # overwrite my own copy, then read the left neighbour's copy (what its left put there)
    remote.copy_(_pattern(100 + rank, numel, dtype))
    odc.sync(group)
    fetched = torch.full((numel,), 1, dtype=dtype)
    odc.get(fetched, remote, left, group)
    everyone = [None] * world
    dist.all_gather_object(everyone, remote.clone())
    assert torch.equal(fetched, everyone[left]), (numel, dtype)
    odc.sync(group)


def _run(rank, world, results, force_cross_host):
    group = odc.new_group(config=odc.TransportConfig(timeout_s=60,
                                                     force_cross_host=force_cross_host))
    for numel in SIZES:
        for dtype in DTYPES:
            _check_put_then_get(group, numel, dtype)
    group.destroy()
    return True


@pytest.mark.parametrize("world_size,force_cross_host",
                         [(2, False), (3, False), (2, True)],
                         ids=["shm-2", "shm-3", "cross-host-2"])
def test_put_and_get_move_the_exact_bytes(world_size, force_cross_host):
    values = run_workers(_run, world_size, force_cross_host,
                         config=LaunchConfig(pass_queue=True, timeout_s=240))
    assert values == [True] * world_size


def _run_bad_arguments(rank, world, results):
    group = odc.new_group(config=odc.TransportConfig(timeout_s=30))
    remote = odc.symmetric_empty(8, torch.float32, group)
    errors = []
    for call in (lambda: odc.get(torch.zeros(8), remote, world, group),
                 lambda: odc.get(torch.zeros(7), remote, 0, group),
                 lambda: odc.put(remote, torch.zeros(8, dtype=torch.float16), 0, group),
                 lambda: odc.put(torch.zeros(8), torch.zeros(8), 0, group),
                 lambda: odc.get(torch.zeros(16)[::2], remote, 0, group)):
        try:
            call()
            errors.append("no error")
        except ValueError as error:
            errors.append(str(error))
    group.destroy()
    collective = odc.new_group(config=odc.TransportConfig(backend="collective"))
    try:
        odc.get(torch.zeros(8), torch.zeros(8), 0, collective)
        errors.append("no error")
    except ValueError as error:
        errors.append(str(error))
    collective.destroy()
    return errors


def test_bad_arguments_raise_value_errors_that_say_what_to_change():
    errors = run_workers(_run_bad_arguments, 2,
                         config=LaunchConfig(pass_queue=True, timeout_s=120))[0]
    assert "peer must be a group rank in [0, 2)" in errors[0]
    assert "must match remote" in errors[1] and "must match remote" in errors[2]
    assert "view of a tensor from symmetric_empty" in errors[3]
    assert "contiguous" in errors[4]
    assert "backend='odc'" in errors[5]
