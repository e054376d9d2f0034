"""Context parallelism under NCCL's ordering (issue 32): cp=2 x pp=2, four processes; the
ring attention's ``batch_isend_irecv`` batches run on the context-parallel group's
NCCL-semantics communicator (tests/dist/runtime/nccl_semantics.py: first-operation
rendezvous, FIFO, rendezvous sends) while each pipeline's point-to-point runs on its own
NCCL-semantics channels. The groups come from the production ``Topology.build`` and are
warmed up by ``warm_up_topology`` (the cp group among them). Every schedule family
finishes with the same losses and gradients as under gloo's tag matching, and the
context-parallel ranks' losses add up to the single-process model's. A ring that posts
each send as a batch of its own before the receive (what ``check_ring_order`` rejects)
completes on gloo, whose sends are eager, and deadlocks under NCCL's rendezvous sends."""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist

from odc_pp.testing.launch import LaunchConfig, run_workers

FAMILIES = ["1f1b", "interleaved", "zb-h1", "zb-h2", "zb-auto", "zbv", "v-half", "v-min",
            "offload", "dualpipev"]
MODEL = dict(num_layers=8, hidden_size=32, num_attention_heads=2)
ROPE = dict(position_embedding_type="rope", normalization="RMSNorm", activation="swiglu",
            add_bias_linear=False)
CP, PP = 2, 2


def _nccl_ops(topo, **options):
    """This rank's NcclSemanticsOps over its pipeline's channels, taking the ring batches
    of its cp group; every rank makes every group's acknowledgement group in one order."""
    from tests.dist.runtime.nccl_semantics import NcclSemanticsOps

    from odc_pp.runtime.p2p_channels import neighbour_pairs
    from odc_pp.layout import topology_groups

    layout = topology_groups(pp=PP, tp=1, dp=1, cp=CP)
    mine = None
    for ranks in layout["pp"]:
        if dist.get_rank() in ranks:
            mine = NcclSemanticsOps(topo.pp_channels, **options)
        else:  # mirror NcclSemanticsOps.__init__: one group per neighbour pair
            for pair in neighbour_pairs(len(ranks)):
                dist.new_group(sorted(ranks[r] for r in pair))
    mine.add_groups([(topo.cp_group if dist.get_rank() in ranks else None, ranks)
                     for ranks in layout["cp"]])
    return mine


def _topology(rank, world_size):
    from odc_pp.layout import ParallelLayout
    from odc_pp.training.distributed import Topology

    return Topology.build(rank, ParallelLayout(world=world_size, local_world=world_size, pp=PP,
                                               cp=CP, dp=world_size // (PP * CP)),
                          torch.device("cpu"))


def worker(rank, world_size):
    from odc_pp.training.distributed import standalone_process_groups
    from odc_pp.training.distributed import warm_up_topology

    topo = _topology(rank, world_size)
    ops = _nccl_ops(topo, creation_timeout_s=60)
    reference_groups = standalone_process_groups()
    with ops.collectives():
        warm_up_topology(topo, ops=ops, timeout_s=60)
        return _families(topo, ops, reference_groups, FAMILIES, comm_timeout_s=40)


def _families(topo, ops, reference_groups, families, *, comm_timeout_s):
    from tests.dist.runtime._parity import build_schedule, make_microbatches, model_config

    from tests.dist.runtime.nccl_semantics import nccl_then_gloo

    from odc_pp.megatron.model import build_chunks
    from odc_pp.training.context_split import split_microbatch

    report = {}
    for index, name in enumerate(families):
        config = model_config(**MODEL, **(ROPE if index % 2 else {}))
        schedule = build_schedule(name, PP, 2 * PP)
        microbatches = make_microbatches(schedule.num_microbatches, batch=1,
                                         equal_lengths=True)
        mine = [split_microbatch(mb, topo.cp_rank, CP) for mb in microbatches]
        chunks = build_chunks(config, pp_rank=topo.pp_rank, pp_size=PP,
                              num_chunks=schedule.num_chunks, placement=schedule.placement,
                              cp_group=topo.cp_group, process_groups=topo.megatron_groups)
        same, loss_nccl = nccl_then_gloo(chunks, schedule, mine, topo, ops,
                                         comm_timeout_s=comm_timeout_s)
        (full,) = build_chunks(config, pp_rank=0, pp_size=1, process_groups=reference_groups)
        reference = sum(float((full(None, mb) * mb.loss_mask).sum()) for mb in microbatches)
        report[name] = (same, loss_nccl, reference)
    return report


@pytest.mark.multiproc
def test_every_family_with_context_parallelism_under_nccl_semantics():
    results = run_workers(worker, CP * PP, config=LaunchConfig(timeout_s=600))
    for name in FAMILIES:
        for rank, report in enumerate(results):
            assert report[name][0], (rank, name, "NCCL-semantics run differs from gloo")
        losses = [report[name][1] for report in results if report[name][1] is not None]
        assert len(losses) == CP, (name, losses)  # the last stage's cp ranks
        reference = results[0][name][2]
        assert abs(sum(losses) - reference) <= 1e-5 * abs(reference), (name, losses,
                                                                        reference)


def _sends_first(topo, tag: int, *, nccl: bool) -> bool:
    """Every cp rank posts its send to the next rank as a batch of its own, then its
    receive from the previous one; whether both completed (NCCL semantics: within 5 s;
    gloo's works complete inside their wait)."""
    from tests.dist.runtime.nccl_semantics import poll

    group, size = topo.cp_group, len(topo.cp_ranks)
    nxt, prv = (topo.cp_ranks[(topo.cp_rank + d) % size] for d in (1, -1))
    send, incoming = torch.full((4,), float(topo.rank)), torch.zeros(4)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, nxt, group, tag)])
    works += dist.batch_isend_irecv([dist.P2POp(dist.irecv, incoming, prv, group, tag)])
    if not nccl:
        return all(work.wait(timeout=datetime.timedelta(seconds=30)) is not False
                   for work in works)
    return all(poll(work, 5.0) for work in works)


def misordered_worker(rank, world_size):
    from odc_pp.training.distributed import warm_up_topology

    topo = _topology(rank, world_size)
    ops = _nccl_ops(topo, creation_timeout_s=30)
    eager = _sends_first(topo, tag=7, nccl=False)  # gloo matches by tag, queues nothing
    with ops.collectives():
        warm_up_topology(topo, ops=ops, timeout_s=30)
        rendezvous = _sends_first(topo, tag=8, nccl=True)
    return eager, rendezvous


@pytest.mark.multiproc
def test_a_ring_posting_sends_alone_deadlocks_under_nccl_semantics():
    results = run_workers(misordered_worker, CP * PP, config=LaunchConfig(timeout_s=200))
    assert results == [(True, False)] * (CP * PP), results
