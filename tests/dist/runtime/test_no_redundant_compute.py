"""The runtime computes nothing twice (issue 31): one minibatch through the pipeline
runtime executes, per rank and per matmul op, exactly the FLOPs of its chunks' forward and
full backward over the same microbatches run outside it with plain autograd (counted by
``torch.utils.flop_counter.FlopCounterMode``). The split B/W, the deferred linears and the
lowered communication add no GEMM work, so any gap to PyTorch's own zero-bubble schedules
on the same chunks is not extra compute."""

import pytest
import torch
import torch.distributed as dist

from odc_pp.testing.launch import LaunchConfig, run_workers
from tests.dist.runtime._parity import build_schedule, make_microbatches, model_config

SCHEDULES = ("1f1b", "zb-h1", "interleaved", "zbv")


def _counted(work) -> dict[str, int]:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        work()
    return {str(op): int(n) for op, n in counter.get_flop_counts().get("Global", {}).items()}


def _plain(chunks, microbatches) -> None:
    """Each local chunk's forward and full backward on every microbatch (inputs of the
    right shape; the values do not change the FLOPs)."""
    for module in (m for chunk in chunks for m in chunk.modules()):
        if hasattr(module, "native_autograd"):
            module.native_autograd = True
    for microbatch in microbatches:
        for chunk in chunks:
            hidden = None
            if not chunk.is_first:
                shape, dtype = chunk.input_shape(microbatch)
                hidden = torch.randn(shape, dtype=dtype, requires_grad=True)
            out = chunk(hidden, microbatch)
            torch.autograd.backward(out, torch.ones_like(out))


def worker(rank, world_size):
    from odc_pp.training.distributed import standalone_process_groups
    from odc_pp.megatron.model import build_chunks
    from odc_pp.runtime import PipelineRuntime, RuntimeConfig

    microbatches = make_microbatches(8, equal_lengths=True)
    report = {}
    for name in SCHEDULES:
        schedule = build_schedule(name, world_size, len(microbatches))
        chunks = build_chunks(model_config(), pp_rank=rank, pp_size=world_size,
                              num_chunks=schedule.num_chunks, placement=schedule.placement,
                              process_groups=standalone_process_groups())
        runtime = PipelineRuntime(RuntimeConfig(), chunks=chunks, pp_group=dist.group.WORLD)
        ours = _counted(lambda: runtime.run_minibatch(schedule, microbatches))
        plain = _counted(lambda: _plain(chunks, microbatches))
        report[name] = {"runtime": ours, "plain": plain}
    return report


@pytest.mark.multiproc
def test_a_pipeline_step_runs_exactly_the_chunks_flops():
    reports = run_workers(worker, 2, config=LaunchConfig(timeout_s=300))
    for rank, report in enumerate(reports):
        for name, counts in report.items():
            assert counts["runtime"] == counts["plain"], (rank, name, counts)
            assert sum(counts["plain"].values()) > 0
