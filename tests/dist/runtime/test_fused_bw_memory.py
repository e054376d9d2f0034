"""A BW action holds nothing for a W (issue 50: the deferred-W buffers were held even when
B and W ran fused, ~4.25 GiB at the Llama-3-8B step): no closure is queued, no byte is
counted as held, the resident peak is the saved activations alone, and the gradients
equal the split schedule's (B then W)."""

import json

import pytest
import torch
import torch.distributed as dist

from odc_pp.testing.launch import LaunchConfig, run_workers
from tests.dist.runtime._parity import make_microbatches, model_config
from tests.dist.runtime._schedules import one_f_one_b

NUM_MICROBATCHES = 3


def _run(runtime, chunks, schedule, microbatches):
    for chunk in chunks:
        chunk.zero_grad(set_to_none=True)
    queued = []
    put = runtime.wgrad_queue.put
    runtime.wgrad_queue.put = lambda work: (queued.append(work), put(work))
    try:
        result = runtime.run_minibatch(schedule, microbatches)
    finally:
        del runtime.wgrad_queue.put
    grads = [p.grad.clone() for chunk in chunks for p in chunk.parameters()]
    return result, len(queued), grads


def worker(rank, world_size, out_path):
    from odc_pp.megatron.model import build_chunks
    from odc_pp.runtime import PipelineRuntime, RuntimeConfig
    from odc_pp.training.distributed import standalone_process_groups

    groups = standalone_process_groups()
    chunks = build_chunks(model_config(), pp_rank=0, pp_size=1, process_groups=groups)
    microbatches = make_microbatches(NUM_MICROBATCHES)
    runtime = PipelineRuntime(RuntimeConfig(track_activations=True), chunks=chunks,
                              pp_group=dist.group.WORLD)
    fused, fused_queued, fused_grads = _run(runtime, chunks, one_f_one_b(1, NUM_MICROBATCHES),
                                            microbatches)
    split, split_queued, split_grads = _run(
        runtime, chunks, one_f_one_b(1, NUM_MICROBATCHES, split=True), microbatches)
    report = {
        "fused_queued": fused_queued, "fused_wgrad_bytes": sum(fused.wgrad_bytes.values()),
        "fused_peak": fused.peak_activation_bytes,
        "largest_saved": max(fused.activation_bytes.values()),
        "split_queued": split_queued, "split_wgrad_bytes": sum(split.wgrad_bytes.values()),
        "same_loss": fused.loss_sum == split.loss_sum,
        "same_grads": all(torch.allclose(a, b, rtol=1e-6, atol=1e-9)
                          for a, b in zip(fused_grads, split_grads)),
    }
    with open(out_path, "w") as handle:
        json.dump(report, handle)


@pytest.mark.multiproc
def test_fused_bw_queues_and_holds_nothing(tmp_path):
    out = tmp_path / "bw.json"
    run_workers(worker, 1, str(out), config=LaunchConfig(timeout_s=180))
    report = json.loads(out.read_text())
    assert report["fused_queued"] == 0 and report["fused_wgrad_bytes"] == 0, report
    # one microbatch in flight at pp=1: the peak is its saved activations, nothing more
    assert report["fused_peak"] == report["largest_saved"], report
    # the split schedule still defers (B leaves its linears' wgrads to W)
    assert report["split_queued"] > 0 and report["split_wgrad_bytes"] > 0, report
    assert report["same_loss"] and report["same_grads"], report
