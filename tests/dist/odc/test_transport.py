"""Multi-process tests of the ODC transport (odc_pp.odc.primitives) against torch.distributed
collectives on gloo: 2, 3 and 4 ranks, odd sizes, low-precision inputs, uneven call counts,
strided groups, the forced cross-host path, a killed rank and /dev/shm hygiene."""

from __future__ import annotations

import faulthandler
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

from odc_pp.odc import primitives as odc
from odc_pp.odc.transport_host import list_segments

from odc_pp.testing.launch import LaunchConfig, run_workers

pytestmark = pytest.mark.multiproc

SIZES = [0, 1, 4099]  # empty, smaller than the world, not a multiple of it
# 48 MiB: gathers with streaming stores (csrc/host/copy_kernels.cpp) and accumulates that
# span many 256 KiB lock chunks
LARGE_NUMEL = 3 * 2**22 + 5
INPUT_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _reference_gather(shard, numel, process_group):
    world = dist.get_world_size(process_group)
    full = torch.empty(shard.numel() * world, dtype=shard.dtype)
    dist.all_gather_into_tensor(full, shard.clone(), group=process_group)
    return full[:numel]


def _contribution(rank, call, numel, dtype):
    generator = torch.Generator().manual_seed(1000 * rank + call + numel)
    return torch.randn(numel, generator=generator).to(dtype)


def _check_group(group, process_group, deterministic_expected):
    """Gather and scatter-accumulate checks on one OdcGroup; every rank calls this."""
    rank, world = group.rank, group.world_size
    largest_shard = -(-max(SIZES) // world)
    # shards/accumulators are views at odd offsets into one larger symmetric buffer
    backing = odc.symmetric_empty(largest_shard + 3, torch.float32, group)
    for numel in SIZES:
        shard_size = -(-numel // world)
        for dtype in (torch.float32, torch.uint8):  # uint8 with odd numel: odd byte counts
            shard = backing.view(dtype)[3:3 + shard_size]
            shard.copy_((torch.arange(shard_size) + 7 * rank + 1).to(dtype))
            odc.sync(group)  # every owner wrote its shard before anyone reads it
            output = torch.zeros(numel, dtype=dtype)
            odc.gather_into_tensor(output, shard, group)
            assert torch.equal(output, _reference_gather(shard, numel, process_group)), (numel, dtype)
            odc.sync(group)  # nobody reads the shards any more
        accumulator = backing[1:1 + shard_size]
        for dtype in INPUT_DTYPES:
            accumulator.fill_(0.5)
            odc.sync(group)  # every owner initialised its accumulator before anyone adds
            # different numbers of calls on each rank (the collective backend needs equal)
            calls = rank + 1 if group.config.backend == "odc" else 2
            local_sum = torch.zeros(numel, dtype=torch.float32)
            works = []
            for call in range(calls):
                contribution = _contribution(rank, call, numel, dtype)
                local_sum += contribution.float()
                works.append(odc.scatter_accumulate(accumulator, contribution, group))
            works[0].wait(timeout=30)
            odc.sync(group)
            start, end = odc.shard_range(numel, rank, world)
            sums = [None] * world
            dist.all_gather_object(sums, local_sum, group=process_group)
            got = accumulator[:end - start]
            # fixed order: ((0.5 + sum_0) + sum_1) + ... with each sum in call order
            ordered = torch.full((end - start,), 0.5)
            for source in range(world):
                ordered += sums[source][start:end]
            if deterministic_expected:
                assert torch.equal(got, ordered), (numel, dtype)
            elif group.config.backend == "collective":
                # one reduce-scatter per call, in the pushed dtype, added into fp32
                expected = torch.full((shard_size,), 0.5)
                for call in range(calls):
                    padded = torch.zeros(shard_size * world, dtype=dtype)
                    padded[:numel] = _contribution(rank, call, numel, dtype)
                    reduced = torch.empty(shard_size, dtype=dtype)
                    dist.reduce_scatter_tensor(reduced, padded, group=process_group)
                    expected += reduced
                assert torch.equal(got, expected[:end - start]), (numel, dtype)
            else:
                padded = torch.zeros(shard_size * world)
                padded[:numel] = local_sum
                reduced = torch.empty(shard_size)
                dist.reduce_scatter_tensor(reduced, padded, group=process_group)
                torch.testing.assert_close(got, reduced[:end - start] + 0.5, rtol=1e-5, atol=1e-5)
            odc.sync(group)  # nobody adds any more before the buffer is reset


def _check_large(group, process_group):
    """One large gather and one fp32 scatter_accumulate per rank against the collectives."""
    rank, world = group.rank, group.world_size
    shard_size = -(-LARGE_NUMEL // world)
    shard = odc.symmetric_empty(shard_size, torch.float32, group)
    shard.copy_(torch.arange(shard_size, dtype=torch.float32) * (rank + 1))
    odc.sync(group)
    output = torch.zeros(LARGE_NUMEL)
    odc.gather_into_tensor(output, shard, group)
    assert torch.equal(output, _reference_gather(shard, LARGE_NUMEL, process_group))
    odc.sync(group)
    shard.zero_()
    odc.sync(group)
    contribution = _contribution(rank, 0, LARGE_NUMEL, torch.float32)
    odc.scatter_accumulate(shard, contribution, group).wait(timeout=60)
    odc.sync(group)
    padded = torch.zeros(shard_size * world)
    padded[:LARGE_NUMEL] = contribution
    reduced = torch.empty(shard_size)
    dist.reduce_scatter_tensor(reduced, padded, group=process_group)
    start, end = odc.shard_range(LARGE_NUMEL, rank, world)
    torch.testing.assert_close(shard[:end - start], reduced[:end - start], rtol=1e-6, atol=1e-6)
    odc.sync(group)


def _run_checks(rank, world, results, configs):
    for config in configs:
        group = odc.new_group(config=config)
        _check_group(group, dist.group.WORLD, config.deterministic)
        _check_large(group, dist.group.WORLD)
        group.destroy()
    if world == 4:  # strided groups, as Megatron's data-parallel groups are
        evens, odds = dist.new_group([0, 2]), dist.new_group([1, 3])
        mine = evens if rank % 2 == 0 else odds
        group = odc.new_group(mine, config=odc.TransportConfig(timeout_s=30))
        assert group.ranks == ([0, 2] if rank % 2 == 0 else [1, 3])
        _check_group(group, mine, deterministic_expected=False)
        group.destroy()
    return os.getpid()


def _make_dead_segment() -> str:
    """A segment created by a process that was then SIGKILLed (a killed run's leftover)."""
    code = ("import os, signal; from odc_pp import _C; "
            "from odc_pp.odc.transport_host import segment_name; "
            "s = _C.Segment.create(segment_name(os.getpid(), 'deadrun00000', 'a0'), 4096); "
            "print(s.name, flush=True); os.kill(os.getpid(), signal.SIGKILL)")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stderr
    return child.stdout.strip().lstrip("/")


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_odc_matches_collectives(world_size):
    leftover = _make_dead_segment() if world_size == 2 else None
    if leftover:
        assert leftover in list_segments()
    configs = {2: [odc.TransportConfig(timeout_s=30),
                   odc.TransportConfig(timeout_s=30, deterministic=True),
                   odc.TransportConfig(backend="collective")],
               # several copy/accumulate threads per rank (the default here is 1: 2 cores)
               3: [odc.TransportConfig(timeout_s=30, deterministic=True, num_threads=3)],
               4: [odc.TransportConfig(timeout_s=30, num_threads=3)]}[world_size]
    pids = run_workers(_run_checks, world_size, configs,
                       config=LaunchConfig(pass_queue=True, timeout_s=240))
    if leftover:
        assert leftover not in list_segments(), "new_group did not remove a dead run's segment"
    left = [name for name in list_segments()
            if any(name.startswith(f"odcpp.{pid}.") for pid in pids)]
    assert left == [], f"segments left after a normal exit: {left}"


def _run_cross_host(rank, world, results):
    for deterministic in (False, True):
        group = odc.new_group(config=odc.TransportConfig(timeout_s=30,
                                                         deterministic=deterministic))
        assert group.cross_host is not None and not any(
            group.local[p] for p in range(world) if p != rank)
        _check_group(group, dist.group.WORLD, deterministic)
        _check_large(group, dist.group.WORLD)
        group.destroy()
    return True


def test_cross_host_path_forced():
    values = run_workers(_run_cross_host, 3,
                         config=LaunchConfig(pass_queue=True,
                                             env={odc.FORCE_CROSS_HOST_ENV: "1"},
                                             timeout_s=240))
    assert values == [True, True, True]


def _run_until_killed(rank, world, results, victim, timeout_s):
    faulthandler.dump_traceback_later(60, exit=True)  # a hang shows its stacks, then fails
    group = odc.new_group(config=odc.TransportConfig(timeout_s=timeout_s))
    accumulator = odc.symmetric_empty(8, torch.float32, group)
    accumulator.zero_()
    odc.sync(group)
    if rank == victim:
        # SIGKILL: no cleanup runs. (The victim never touches the results queue: a process
        # killed while holding the queue's lock would block the other ranks' reports.)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)
    started = time.monotonic()
    try:
        odc.scatter_accumulate(accumulator, torch.ones(8 * world), group)
        odc.sync(group)
    except odc.PeerError as error:
        elapsed = time.monotonic() - started
        # Stay up until the other survivor has hit its own timeout: a survivor that exits
        # at once resets its connections, and the other one then (rightly) names *it*
        # (a job exits echoes late for the same reason: odc_pp.training.failures).
        time.sleep(timeout_s + 1)
        return str(error), elapsed
    return "no error", time.monotonic() - started


@pytest.mark.parametrize("cross_host", [False, True], ids=["shm", "cross-host"])
def test_killed_rank_raises_naming_it(cross_host):
    world, victim, timeout_s = 3, 2, 5.0
    env = {odc.FORCE_CROSS_HOST_ENV: "1"} if cross_host else {}
    values = run_workers(_run_until_killed, world, victim, timeout_s,
                         config=LaunchConfig(pass_queue=True, env=env, expect=(0, 1),
                                             timeout_s=120))
    for rank in (0, 1):
        message, elapsed = values[rank]
        assert f"group rank {victim}" in message, message
        assert elapsed < timeout_s + 3, (message, elapsed)


def _run_push_dtype(rank, world, results):
    from odc_pp.odc import transport_collective

    wire = []

    class Recording:  # torch.distributed as the collective backend sees it
        def __getattr__(self, name):
            return getattr(dist, name)

        def reduce_scatter_tensor(self, output, input, **kwargs):
            wire.append((str(output.dtype), str(input.dtype), input.numel()))
            return dist.reduce_scatter_tensor(output, input, **kwargs)

    transport_collective.dist = Recording()
    group = odc.new_group(config=odc.TransportConfig(backend="collective"))
    try:
        _check_group(group, dist.group.WORLD, deterministic_expected=False)
    finally:
        transport_collective.dist = dist
        group.destroy()
    return wire


def test_collective_reduce_scatters_in_the_push_dtype():
    """The collective baseline moves what the one-sided backend pushes: a bf16 / fp16
    gradient is reduce-scattered as bf16 / fp16 (half the bytes of fp32), and the
    accumulator equals fp32 adds of those reduce-scatters exactly (_check_group)."""
    wire = run_workers(_run_push_dtype, 2, config=LaunchConfig(pass_queue=True,
                                                              timeout_s=120))[0]
    pushed = [(out, inp) for out, inp, numel in wire if numel]
    dtypes = {f"torch.{name}" for name in ("float32", "bfloat16", "float16")}
    assert {out for out, _ in pushed} == dtypes
    assert all(out == inp for out, inp in pushed), pushed
