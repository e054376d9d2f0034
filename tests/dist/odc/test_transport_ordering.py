"""The ordering contract at ``sync`` between an owner's own writes to its accumulator
(zeroing, clipping, the optimizer) and the peers' contributions (see the contract in
odc_pp/odc/transport_path.py).

A deterministic group stages every ``scatter_accumulate`` and applies it during the next
``sync``. Those adds must not start at an owner before the owner has entered that
``sync``: otherwise a fast peer's read-modify-write overlaps the owner's ``zero_()`` (the
end-of-step sync of the engine) and the zeroing is lost, which silently left a window of the
previous step's gradient in the accumulator of long training runs.

The test makes the bad interleaving certain instead of rare: before it writes, the owner
waits (up to ``GRACE_S``) until a peer's contribution of this interval shows up in its
accumulator. Under a correct transport nothing shows up (contributions land only after the
owner entered sync) and the owner writes after the grace period; under the broken one the
peer's add lands first and the owner's write destroys it.
"""

from __future__ import annotations

import time

import pytest
import torch

from odc_pp.odc import primitives as odc

from odc_pp.testing.launch import LaunchConfig, run_workers

pytestmark = pytest.mark.multiproc

NUMEL = 4099
GRACE_S = 2.0
OWNER_VALUE = 5.0


def _owner_write_then_sync(rank, world, results, deterministic, device_kind, env_forced):
    device = torch.device("cpu")
    if device_kind == "cuda":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    group = odc.new_group(config=odc.TransportConfig(timeout_s=60, deterministic=deterministic,
                                                     force_cross_host=env_forced))
    shard_size = -(-NUMEL // world)
    accumulator = odc.symmetric_empty(shard_size, torch.float32, group, device=device)
    accumulator.zero_()
    odc.sync(group)
    outcomes = []
    for owner in range(world):  # every rank plays the owner once
        if rank != owner:
            # a peer: contribute to every owner, then sync at once (a fast replica)
            odc.scatter_accumulate(accumulator, torch.ones(NUMEL, device=device), group)
            odc.sync(group)
            seen_early = None
        else:
            # the owner: do not write while a peer's add of this interval may still be
            # coming; wait until one has visibly landed (the race) or the grace period ends
            deadline = time.monotonic() + GRACE_S
            while time.monotonic() < deadline and not bool(accumulator.any()):
                time.sleep(0.01)
            seen_early = bool(accumulator.any())
            accumulator.fill_(OWNER_VALUE)  # the owner's write: zero / clip / step
            odc.sync(group)
        start, end = odc.shard_range(NUMEL, rank, world)
        got = accumulator[:end - start].cpu()
        # every peer added 1 into every owner after the owner's own write (or, for a
        # non-owner, after its reset below); own contributions land the same way
        contributors = world - 1
        base = OWNER_VALUE if rank == owner else 0.0
        expected = torch.full((end - start,), base + contributors)
        outcomes.append((owner, seen_early, torch.equal(got, expected),
                         sorted(set(got.tolist()))[:4]))
        odc.sync(group)  # nobody adds into the accumulator any more
        accumulator.zero_()
        odc.sync(group)
    group.destroy()
    return outcomes


@pytest.mark.parametrize("force_cross_host", [False, True], ids=["shm", "cross-host"])
def test_staged_adds_land_after_the_owners_write_before_sync(force_cross_host):
    """Deterministic mode: owner writes before sync k precede the adds applied in sync k."""
    values = run_workers(_owner_write_then_sync, 2, True, "cpu", force_cross_host,
                         config=LaunchConfig(pass_queue=True, timeout_s=180))
    for rank, outcomes in enumerate(values):
        for owner, seen_early, ok, sample in outcomes:
            assert ok, (f"rank {rank}, owner {owner}: accumulator {sample} after sync; a "
                        f"peer's staged add landed before the owner's write "
                        f"(seen before the owner entered sync: {seen_early})")
            if rank == owner:
                assert not seen_early, f"owner {owner} saw a peer's add before entering sync"


@pytest.mark.gpu
def test_staged_adds_land_after_the_owners_write_before_sync_cuda():
    """The same on the CUDA IPC path (the owner's write is queued on its current stream)."""
    values = run_workers(_owner_write_then_sync, 2, True, "cuda", False,
                         config=LaunchConfig(pass_queue=True, timeout_s=180))
    for rank, outcomes in enumerate(values):
        for owner, seen_early, ok, sample in outcomes:
            assert ok, f"rank {rank}, owner {owner}: accumulator {sample} after sync"
            if rank == owner:
                assert not seen_early, f"owner {owner} saw a peer's add before entering sync"
