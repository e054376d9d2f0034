"""Collective release of symmetric allocations (odc.symmetric_free): staged contributions
of the released allocation are dropped (no later sync adds into it), the allocation is no
longer located, allocation ids stay aligned across members, and later allocations keep
working. CPU, 2 ranks (the CUDA variant is in test_transport_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from odc_pp.odc import primitives as odc

from odc_pp.testing.launch import LaunchConfig, run_workers

pytestmark = pytest.mark.multiproc


def _run(rank, world, results, deterministic):
    group = odc.new_group(config=odc.TransportConfig(timeout_s=30, deterministic=deterministic))
    doomed = odc.symmetric_empty(8, torch.float32, group)
    kept = odc.symmetric_empty(8, torch.float32, group)
    doomed.zero_()
    kept.zero_()
    odc.sync(group)
    odc.scatter_accumulate(doomed[:4], torch.ones(4 * world), group).wait(30)
    odc.scatter_accumulate(kept[:4], torch.ones(4 * world), group).wait(30)
    odc.sync(group)
    assert torch.equal(kept[:4], torch.full((4,), float(world)))
    # staged (deterministic) but never synced into `doomed`: dropped by the release
    odc.scatter_accumulate(doomed[:4], torch.ones(4 * world), group)
    odc.symmetric_free(doomed, group)
    try:
        odc.scatter_accumulate(doomed[:4], torch.ones(4 * world), group)
        raise AssertionError("a released allocation was still located")
    except ValueError as error:
        assert "symmetric_empty" in str(error)
    odc.scatter_accumulate(kept[:4], torch.ones(4 * world), group).wait(30)
    odc.sync(group)  # would add into the released buffer if its staging were kept
    assert torch.equal(kept[:4], torch.full((4,), 2.0 * world))
    later = odc.symmetric_empty(4, torch.float32, group)  # alloc id 2 on every member
    later.fill_(rank + 1)
    odc.sync(group)
    gathered = torch.zeros(4 * world)
    odc.gather_into_tensor(gathered, later, group)
    assert torch.equal(gathered, torch.arange(1, world + 1).float().repeat_interleave(4))
    odc.sync(group)
    group.destroy()
    return True


@pytest.mark.parametrize("deterministic", [False, True])
def test_symmetric_free_is_collective_and_drops_staging(deterministic):
    assert run_workers(_run, 2, deterministic,
                       config=LaunchConfig(pass_queue=True, timeout_s=120)) == [True, True]
