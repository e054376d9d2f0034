"""Sent tensors live only while in flight: across a minibatch of m = 4 pp microbatches a
rank holds O(pp) sent activations/gradients, not O(m) (issue 21, item 3).

The runtime runs 1f1b and zbv at pp = 2 with m = 8 under gloo (receives pre-posted: a send
to a peer is waited once that peer was heard from) and under the NCCL-semantics backend
(sends polled with ``is_completed``). Before the fix every send was kept until the
minibatch ended: the rank-0 maximum was m (1f1b) and more (zbv).
"""

from __future__ import annotations

import pytest
import torch.distributed as dist

from odc_pp.testing.launch import LaunchConfig, run_workers

MODEL = dict(num_layers=4, hidden_size=16, num_attention_heads=2)
PP = 2
M = 4 * PP


def send_worker(rank, world_size):
    from tests.dist.runtime._parity import build_schedule, make_microbatches, model_config
    from tests.dist.runtime.nccl_semantics import NcclSemanticsOps

    from odc_pp.training.distributed import standalone_process_groups
    from odc_pp.megatron.model import build_chunks
    from odc_pp.runtime import PipelineRuntime, RuntimeConfig
    from odc_pp.runtime.p2p_channels import pipeline_channels
    from odc_pp.runtime.warmup import warm_up

    groups = standalone_process_groups()
    channels = pipeline_channels(dist.group.WORLD)
    nccl_ops = NcclSemanticsOps(channels)
    # the production start-up warm-up: without it the NCCL-semantics backend's lazy
    # communicator creation hangs at the first message (odc_pp.runtime.warmup)
    warm_up(channels.communicators(), ops=nccl_ops, rank=rank, timeout_s=60)
    report = {}
    for name in ("1f1b", "zbv"):
        schedule = build_schedule(name, world_size, M)
        microbatches = make_microbatches(M, batch=1, equal_lengths=True)
        chunks = build_chunks(model_config(**MODEL), pp_rank=rank, pp_size=world_size,
                              num_chunks=schedule.num_chunks, placement=schedule.placement,
                              process_groups=groups)
        sends = sum(a.kind.value.startswith("SEND") for a in schedule.ranks[rank])
        for backend, ops, prepost in (("gloo", None, None),
                                      ("nccl-semantics", nccl_ops, False)):
            runtime = PipelineRuntime(
                RuntimeConfig(comm_timeout_s=60, prepost_receives=prepost), chunks=chunks,
                pp_group=dist.group.WORLD, channels=channels, p2p_ops=ops)
            runtime.run_minibatch(schedule, microbatches)
            report[(name, backend)] = (runtime.transport.max_inflight_sends, sends)
    return report


@pytest.mark.multiproc
def test_live_sent_tensors_grow_with_pp_not_m():
    results = run_workers(send_worker, PP, config=LaunchConfig(timeout_s=240))
    for rank, report in enumerate(results):
        for (name, backend), (max_live, sends) in report.items():
            print(f"rank {rank} {name} {backend}: at most {max_live} of {sends} sends live")
            assert sends >= M, (rank, name, sends)  # the old policy held all of them
            assert max_live <= 2 * PP, (rank, name, backend, max_live, sends)
