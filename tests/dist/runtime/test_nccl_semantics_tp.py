"""Tensor-parallel collectives interleaved with pipeline point-to-point under NCCL's
ordering (tests/dist/runtime/nccl_semantics.py): tp=2 (with sequence parallelism) x pp=2, four
processes, GPT and RoPE/SwiGLU models in turn, each tp rank's pipeline on its own
NCCL-semantics channels while the tp all-gathers / reduce-scatters / all-reduces of the
same stage run between the pipelines.
The groups come from the production ``Topology.build`` and are warmed up by
``warm_up_topology`` under the backend's creation rule (the tp collectives too, through
``NcclSemanticsOps.collectives``). Every family finishes, with the same losses and
gradients as under gloo's tag matching, and the loss equals the tp=1 model's. Without
the warm-up (the code before it) 1f1b hangs at communicator creation: a TimeoutError
names the blocked rank and the one it waits for."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from odc_pp.testing.launch import LaunchConfig, run_workers

FAMILIES = ["1f1b", "interleaved", "zb-h1", "zbv", "v-half", "dualpipev", "offload"]
MODEL = dict(num_layers=8, hidden_size=32, num_attention_heads=2)
# every other family runs a RoPE/SwiGLU model: its embedding output is reduce-scattered
# along the sequence (learned positions: all-reduced, then split)
ROPE = dict(position_embedding_type="rope", normalization="RMSNorm", activation="swiglu",
            add_bias_linear=False)
TP, PP = 2, 2


def _nccl_ops_for(pipelines, channels, **options):
    """This rank's NcclSemanticsOps; the others' acknowledgement groups are created too,
    in the same order, since ``new_group`` is collective over the default group."""
    from tests.dist.runtime.nccl_semantics import NcclSemanticsOps

    from odc_pp.runtime.p2p_channels import neighbour_pairs

    mine = None
    for ranks in pipelines:
        if dist.get_rank() in ranks:
            mine = NcclSemanticsOps(channels, **options)
        else:  # mirror NcclSemanticsOps.__init__: one group per neighbour pair
            for pair in neighbour_pairs(len(ranks)):
                dist.new_group(sorted(ranks[r] for r in pair))
    return mine


def worker(rank, world_size, warm):
    from odc_pp.training.distributed import standalone_process_groups
    from odc_pp.megatron.tp import TensorParallel
    from odc_pp.layout import ParallelLayout, topology_groups
    from odc_pp.training.distributed import Topology, warm_up_topology

    topo = Topology.build(rank, ParallelLayout(world=world_size, local_world=world_size, pp=PP,
                                               tp=TP, dp=world_size // (PP * TP)),
                          torch.device("cpu"))
    ops = _nccl_ops_for(topology_groups(pp=PP, tp=TP, dp=1)["pp"], topo.pp_channels,
                        creation_timeout_s=60 if warm else 3)
    tensor_parallel = TensorParallel(group=topo.tp_group, sequence_parallel=True)
    reference_groups = standalone_process_groups()
    with ops.collectives():
        if not warm:
            try:
                _families(topo, ops, tensor_parallel, reference_groups, ["1f1b"],
                          comm_timeout_s=6)
                return "finished"
            except TimeoutError as error:
                return f"TimeoutError: {error}"
        warm_up_topology(topo, ops=ops, timeout_s=60)
        return _families(topo, ops, tensor_parallel, reference_groups, FAMILIES,
                         comm_timeout_s=40)


def _families(topo, ops, tensor_parallel, reference_groups, families, *, comm_timeout_s):
    from tests.dist.runtime._parity import build_schedule, make_microbatches, model_config

    from tests.dist.runtime.nccl_semantics import nccl_then_gloo

    from odc_pp.megatron.model import build_chunks

    pp_rank = topo.pp_rank
    report = {}
    for index, name in enumerate(families):
        config = model_config(**MODEL, **(ROPE if index % 2 else {}))
        schedule = build_schedule(name, PP, 2 * PP)
        microbatches = make_microbatches(schedule.num_microbatches, batch=1,
                                         equal_lengths=True)
        chunks = build_chunks(config, pp_rank=pp_rank, pp_size=PP,
                              num_chunks=schedule.num_chunks, placement=schedule.placement,
                              tensor_parallel=tensor_parallel,
                              process_groups=topo.megatron_groups)
        same, loss_nccl = nccl_then_gloo(chunks, schedule, microbatches, topo, ops,
                                         comm_timeout_s=comm_timeout_s)
        # the tp=1, pp=1 model on the same microbatches
        (full,) = build_chunks(config, pp_rank=0, pp_size=1, process_groups=reference_groups)
        reference = sum(float((full(None, mb) * mb.loss_mask).sum()) for mb in microbatches)
        report[name] = (same, loss_nccl, reference)
    return report


@pytest.mark.multiproc
def test_tp_collectives_with_pipeline_p2p_under_nccl_semantics():
    results = run_workers(worker, TP * PP, True, config=LaunchConfig(timeout_s=400))
    for rank, report in enumerate(results):
        assert sorted(report) == sorted(FAMILIES)
        for name, (same, loss, reference) in report.items():
            assert same, (rank, name, "NCCL-semantics run differs from gloo")
            if loss is not None:  # the last stage's tp ranks
                assert abs(loss - reference) <= 1e-5 * abs(reference), (rank, name, loss,
                                                                        reference)
    losses = {name: [r[name][1] for r in results] for name in FAMILIES}
    assert all(sum(loss is not None for loss in values) == TP for values in losses.values())


@pytest.mark.multiproc
def test_tp_pipeline_hangs_at_communicator_creation_without_the_warm_up():
    results = run_workers(worker, TP * PP, False, config=LaunchConfig(timeout_s=200))
    print(results)
    assert all(text.startswith("TimeoutError") for text in results), results
    blocked = [text for text in results if "blocks in its creation" in text]
    # each tp rank's pipeline: its stage 0 waits for its stage 1 and the other way round
    assert len(blocked) == TP * PP, results
    for rank, text in enumerate(results):
        peer = rank + TP if rank < TP else rank - TP
        assert text.startswith(f"TimeoutError: rank {rank}:") and f"rank(s) [{peer}]" in text
