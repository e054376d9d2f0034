"""The runtime under NCCL ordering (tests/dist/runtime/nccl_semantics.py) and timeouts that fire.

* every schedule family at pp 2 and 4 runs through the real runtime on the NCCL-semantics
  backend over one channel per direction, after the production start-up warm-up
  (``Topology.build`` + ``warm_up_topology``), with the same losses and gradients as gloo;
* without the warm-up (the code before it), NCCL's lazy communicator creation hangs
  1f1b and zb-h1 at pp 2 and 4, interleaved at pp 2, v-half and v-min at pp 4: a
  TimeoutError names the blocked rank and the member it waits for;
* on the old mapping (one pipeline group for both directions) the same backend deadlocks,
  and the transport's timeout reports it (no hang);
* a SIGSTOPped peer makes a rank raise TimeoutError within the timeout, naming the peer,
  under gloo and under the NCCL-semantics backend.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
import torch.distributed as dist

from odc_pp.testing.launch import LaunchConfig, run_workers

FAMILIES = ["1f1b", "interleaved", "zb-h1", "zb-h2", "zb-auto", "zbv", "v-half", "v-min",
            "offload", "dualpipev", "gis"]
MODEL = dict(num_layers=8, hidden_size=32, num_attention_heads=2)


def _chunks(schedule, groups):
    from tests.dist.runtime._parity import model_config

    from odc_pp.megatron.model import build_chunks

    return build_chunks(model_config(**MODEL), pp_rank=dist.get_rank(), pp_size=schedule.pp,
                        num_chunks=schedule.num_chunks, placement=schedule.placement,
                        process_groups=groups)


def _run(chunks, schedule, microbatches, **runtime_args):
    from odc_pp.runtime import PipelineRuntime, RuntimeConfig

    for chunk in chunks:
        chunk.zero_grad(set_to_none=True)
    runtime = PipelineRuntime(RuntimeConfig(comm_timeout_s=60, prepost_receives=False),
                              chunks=chunks, pp_group=dist.group.WORLD, **runtime_args)
    result = runtime.run_minibatch(schedule, microbatches)
    grads = [p.grad.clone() for chunk in chunks for p in chunk.parameters()
             if p.grad is not None]
    return result.loss_sum, grads


def families_worker(rank, world_size):
    from tests.dist.runtime._parity import build_schedule, make_microbatches
    from tests.dist.runtime.nccl_semantics import NcclSemanticsOps

    from odc_pp.training.distributed import standalone_process_groups
    from odc_pp.runtime import PipelineRuntime, RuntimeConfig
    from odc_pp.runtime.p2p_channels import ChannelLayout, pipeline_channels
    from odc_pp.runtime.warmup import warm_up
    from odc_pp.layout import ParallelLayout
    from odc_pp.training.distributed import Topology, warm_up_topology

    groups = standalone_process_groups()
    topo = Topology.build(rank, ParallelLayout(world=world_size, local_world=world_size,
                                               pp=world_size), torch.device("cpu"))
    channels = topo.pp_channels
    ops = NcclSemanticsOps(channels, creation_timeout_s=60)
    report = {}
    with ops.collectives():
        warm_up_topology(topo, ops=ops, timeout_s=60)
        for name in FAMILIES:
            schedule = build_schedule(name, world_size, 2 * world_size)
            microbatches = make_microbatches(schedule.num_microbatches, batch=1,
                                             equal_lengths=True)
            chunks = _chunks(schedule, groups)
            loss_gloo, grads_gloo = _run(chunks, schedule, microbatches, channels=channels)
            loss_nccl, grads_nccl = _run(chunks, schedule, microbatches, channels=channels,
                                         p2p_ops=ops)
            report[name] = (loss_gloo == loss_nccl and len(grads_gloo) == len(grads_nccl)
                            and all(torch.equal(a, b) for a, b in zip(grads_gloo, grads_nccl)),
                            loss_nccl)
    # the old mapping: one group (a fresh one, warmed up) carries both directions
    old_group = dist.new_group(list(range(world_size)))
    old = pipeline_channels(old_group, layout=ChannelLayout.SHARED)
    old_ops = NcclSemanticsOps(old)
    warm_up(old.communicators(), ops=old_ops, rank=rank, timeout_s=60)
    schedule = build_schedule("1f1b", world_size, 2 * world_size)
    microbatches = make_microbatches(schedule.num_microbatches, batch=1, equal_lengths=True)
    runtime = PipelineRuntime(RuntimeConfig(comm_timeout_s=3, prepost_receives=False),
                              chunks=_chunks(schedule, groups), pp_group=old_group,
                              channels=old, p2p_ops=old_ops)
    started = time.monotonic()
    try:
        runtime.run_minibatch(schedule, microbatches)
        old_result = "finished"
    except TimeoutError as error:
        old_result = f"TimeoutError after {time.monotonic() - started:.1f}s: {error}"
    return report, old_result


@pytest.mark.multiproc
@pytest.mark.parametrize("pp", [2, 4])
def test_every_family_runs_under_nccl_semantics_and_the_old_mapping_deadlocks(pp):
    """With the production warm-up (Topology.build + warm_up_topology) first."""
    results = run_workers(families_worker, pp, config=LaunchConfig(timeout_s=300))
    for rank, (report, old_result) in enumerate(results):
        assert sorted(report) == sorted(FAMILIES)
        for name, (equal, loss) in report.items():
            assert equal, (rank, name, "NCCL-semantics run differs from gloo")
            assert (loss is not None) == (rank == (0 if name in (
                "zbv", "v-half", "v-min", "dualpipev") else pp - 1)), (rank, name, loss)
        print(f"pp={pp} rank {rank} old mapping: {old_result}")
    # every rank is stuck somewhere; at least one waits on a peer's message at a compute
    assert all(r[1].startswith("TimeoutError") for r in results), [r[1] for r in results]
    assert any("did not complete within 3s (peer: pipeline rank" in r[1] for r in results)


def stall_worker(rank, world_size, messages, backend):
    from tests.dist.runtime._parity import build_schedule, make_microbatches
    from tests.dist.runtime.nccl_semantics import NcclSemanticsOps

    from odc_pp.training.distributed import standalone_process_groups
    from odc_pp.runtime import PipelineRuntime, RuntimeConfig
    from odc_pp.runtime.p2p_channels import pipeline_channels

    from odc_pp.runtime.p2p import TorchP2POps
    from odc_pp.runtime.warmup import warm_up

    groups = standalone_process_groups()
    channels = pipeline_channels(dist.group.WORLD)
    ops = NcclSemanticsOps(channels) if backend == "nccl-semantics" else None
    warm_up(channels.communicators(), ops=ops or TorchP2POps(torch.device("cpu")),
            rank=rank, timeout_s=60)
    schedule = build_schedule("1f1b", world_size, 4)
    runtime = PipelineRuntime(RuntimeConfig(comm_timeout_s=3, prepost_receives=False),
                              chunks=_chunks(schedule, groups), pp_group=dist.group.WORLD,
                              channels=channels, p2p_ops=ops)
    microbatches = make_microbatches(4, batch=1, equal_lengths=True)
    dist.barrier()
    if rank == 1:
        # stop only once the message is wholly in the pipe and the feeder thread is gone:
        # a process stopped while its feeder holds the queue's shared write lock blocks
        # every other rank's result behind it (what made this test hang before)
        messages.put(("stopping", os.getpid()))
        messages.close()
        messages.join_thread()
        os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(120)  # killed by run_workers while stopped
        return None
    started = time.monotonic()
    try:
        runtime.run_minibatch(schedule, microbatches)
        outcome = "finished"
    except TimeoutError as error:
        outcome = str(error)
    return time.monotonic() - started, outcome


@pytest.mark.multiproc
@pytest.mark.parametrize("backend", ["gloo", "nccl-semantics"])
def test_stalled_peer_raises_within_the_timeout_naming_it(backend):
    results = run_workers(stall_worker, 2, backend,
                          config=LaunchConfig(timeout_s=120, pass_queue=True, expect=(0,),
                                              process_group_timeout_s=8))
    elapsed, text = results[0]
    assert "pipeline rank 0" in text and "peer: pipeline rank 1" in text, text
    assert 3 <= elapsed < 60, (elapsed, text)


# what the static model (tests/schedule/test_nccl_order.py) finds stuck without the warm-up
LAZY_STUCK = {2: ["1f1b", "interleaved", "zb-h1"], 4: ["1f1b", "zb-h1", "v-half", "v-min"]}


def lazy_creation_worker(rank, world_size, families):
    """Each family on fresh channels with no warm-up: creation is lazy, as before."""
    from tests.dist.runtime._parity import build_schedule, make_microbatches
    from tests.dist.runtime.nccl_semantics import NcclSemanticsOps

    from odc_pp.training.distributed import standalone_process_groups
    from odc_pp.runtime import PipelineRuntime, RuntimeConfig
    from odc_pp.runtime.p2p_channels import pipeline_channels

    groups = standalone_process_groups()
    outcome = {}
    for name in families:
        channels = pipeline_channels(dist.group.WORLD)  # fresh groups: nothing created
        ops = NcclSemanticsOps(channels, creation_timeout_s=3)
        schedule = build_schedule(name, world_size, 2 * world_size)
        runtime = PipelineRuntime(RuntimeConfig(comm_timeout_s=6, prepost_receives=False),
                                  chunks=_chunks(schedule, groups), pp_group=dist.group.WORLD,
                                  channels=channels, p2p_ops=ops)
        microbatches = make_microbatches(schedule.num_microbatches, batch=1,
                                         equal_lengths=True)
        try:
            runtime.run_minibatch(schedule, microbatches)
            outcome[name] = "finished"
        except TimeoutError as error:
            outcome[name] = f"TimeoutError: {error}"
        dist.barrier()
    return outcome


@pytest.mark.multiproc
@pytest.mark.parametrize("pp", [2, 4])
def test_lazy_communicator_creation_hangs_without_the_warm_up(pp):
    """The code before the warm-up under the creation rule: the first pipeline message
    hangs, reported as a TimeoutError that names the blocked rank and the one it waits
    for (on the parent commit every family above ran into this)."""
    results = run_workers(lazy_creation_worker, pp, LAZY_STUCK[pp],
                          config=LaunchConfig(timeout_s=300))
    for name in LAZY_STUCK[pp]:
        texts = [r[name] for r in results]
        print(f"pp={pp} {name}: {texts}")
        assert all(t.startswith("TimeoutError") for t in texts), (name, texts)
        blocked = [t for t in texts if "blocks in its creation" in t]
        assert len(blocked) >= 2, (name, texts)
        for text in blocked:  # "rank A: ... rank(s) [B] did not ..."
            me = int(text.split("rank ", 1)[1].split(":", 1)[0])
            waits_for = text.split("rank(s) [", 1)[1].split("]", 1)[0]
            assert waits_for and str(me) not in waits_for.split(", "), text
