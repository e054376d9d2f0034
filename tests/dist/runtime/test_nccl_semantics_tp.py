"""Tensor-parallel collectives interleaved with pipeline point-to-point under NCCL's
ordering (tests/dist/runtime/nccl_semantics.py): tp=2 (with sequence parallelism) x pp=2, four
processes, GPT and RoPE/SwiGLU models in turn, each tp rank's pipeline on its own
NCCL-semantics channels while the tp all-gathers / reduce-scatters / all-reduces of the
same stage run between the pipelines.
Every family finishes, with the same losses and gradients as under gloo's tag matching,
and the loss equals the tp=1 model's."""

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


def _nccl_ops_for(pipelines, channels):
    """This rank's NcclSemanticsOps; the others' acknowledgement groups are created too,
    in the same order, since ``new_group`` is collective over the default group."""
    from tests.dist.runtime.nccl_semantics import NcclSemanticsOps

    from odc_pp.runtime.p2p_channels import neighbour_pairs

    mine = None
    for ranks in pipelines:
        if dist.get_rank() in ranks:
            mine = NcclSemanticsOps(channels)
        else:  # mirror NcclSemanticsOps.__init__: one group per neighbour pair
            for pair in neighbour_pairs(len(ranks)):
                dist.new_group(sorted(ranks[r] for r in pair))
    return mine


def worker(rank, world_size):
    from tests.dist.runtime._parity import build_schedule, make_microbatches, model_config

    from odc_pp.megatron.compat import singleton_process_groups
    from odc_pp.megatron.model import build_chunks
    from odc_pp.megatron.tp import TensorParallel
    from odc_pp.runtime import PipelineRuntime, RuntimeConfig
    from odc_pp.runtime.p2p_channels import create_pipeline_channels
    from odc_pp.training.distributed import layout_rank

    tp_rank, pp_rank = rank % TP, rank // TP
    tp_groups = [dist.new_group([layout_rank(dp_rank=0, pp_rank=p, tp_rank=t, pp=PP, tp=TP)
                                 for t in range(TP)]) for p in range(PP)]
    pipelines = [[layout_rank(dp_rank=0, pp_rank=p, tp_rank=t, pp=PP, tp=TP)
                  for p in range(PP)] for t in range(TP)]
    pp_groups = [dist.new_group(ranks) for ranks in pipelines]
    channels = create_pipeline_channels(pipelines)
    ops = _nccl_ops_for(pipelines, channels)
    tensor_parallel = TensorParallel(group=tp_groups[pp_rank], sequence_parallel=True)
    reference_groups = singleton_process_groups()
    report = {}
    for index, name in enumerate(FAMILIES):
        config = model_config(**MODEL, **(ROPE if index % 2 else {}))
        schedule = build_schedule(name, PP, 2 * PP)
        microbatches = make_microbatches(schedule.num_microbatches, batch=1,
                                         equal_lengths=True)
        chunks = build_chunks(config, pp_rank=pp_rank, pp_size=PP,
                              num_chunks=schedule.num_chunks, placement=schedule.placement,
                              tensor_parallel=tensor_parallel)
        outcome = []
        for p2p_ops in (None, ops):  # gloo's tag matching, then NCCL's order
            for chunk in chunks:
                chunk.zero_grad(set_to_none=True)
            runtime = PipelineRuntime(RuntimeConfig(comm_timeout_s=40,
                                                    prepost_receives=False),
                                      chunks=chunks, pp_group=pp_groups[tp_rank],
                                      channels=channels, p2p_ops=p2p_ops)
            result = runtime.run_minibatch(schedule, microbatches)
            outcome.append((result.loss_sum, [p.grad.clone() for c in chunks
                                              for p in c.parameters()]))
        (loss_gloo, grads_gloo), (loss_nccl, grads_nccl) = outcome
        same = loss_gloo == loss_nccl and all(torch.equal(a, b)
                                              for a, b in zip(grads_gloo, grads_nccl))
        # the tp=1, pp=1 model on the same microbatches
        (full,) = build_chunks(config, pp_rank=0, pp_size=1, process_groups=reference_groups)
        reference = sum(float((full(None, mb) * mb.loss_mask).sum()) for mb in microbatches)
        report[name] = (same, loss_nccl, reference)
    return report


@pytest.mark.multiproc
def test_tp_collectives_with_pipeline_p2p_under_nccl_semantics():
    results = run_workers(worker, TP * PP, config=LaunchConfig(timeout_s=400))
    for rank, report in enumerate(results):
        assert sorted(report) == sorted(FAMILIES)
        for name, (same, loss, reference) in report.items():
            assert same, (rank, name, "NCCL-semantics run differs from gloo")
            if loss is not None:  # the last stage's tp ranks
                assert abs(loss - reference) <= 1e-5 * abs(reference), (rank, name, loss,
                                                                        reference)
    losses = {name: [r[name][1] for r in results] for name in FAMILIES}
    assert all(sum(loss is not None for loss in values) == TP for values in losses.values())
