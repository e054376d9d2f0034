"""Issue 29 (Deliver 3): no device-to-host synchronisation inside F, B or W. One process,
pp=1, dp=1, a tiny Llama-shaped bf16 model (RMSNorm, SwiGLU, RoPE, GQA) on packed rows
(several documents per row: the varlen path and its cu_seqlens) built by the training's
own components; after a warm-up minibatch, every compute action of the next minibatch
runs under ``torch.cuda.set_sync_debug_mode("error")``, so any synchronising call inside
one (``.item()``, ``.tolist()``, a host copy of a device tensor, a blocking wait) raises
and is named. The allowed points are outside the actions: building the microbatch (the
host computes the packed-row metadata) and the minibatch's end (loss, optimizer)."""

from __future__ import annotations

import json

import pytest
import torch

from odc_pp.testing.launch import LaunchConfig, run_workers

FLAGS = ["--num-layers", "2", "--hidden-size", "256", "--num-attention-heads", "4",
         "--num-query-groups", "2", "--group-query-attention", "--ffn-hidden-size", "512",
         "--seq-length", "256", "--max-position-embeddings", "256", "--swiglu",
         "--normalization", "RMSNorm", "--position-embedding-type", "rope",
         "--disable-bias-linear", "--untie-embeddings-and-output-weights", "--bf16",
         "--mock-data", "--vocab-size", "512", "--micro-batch-size", "1",
         "--global-batch-size", "4", "--train-iters", "2", "--lr", "1e-4",
         "--pipeline-schedule", "1f1b"]
COMPUTE = ("F", "B", "W", "BW")


def worker(rank, world_size, out_path):
    from odc_pp.data import Microbatch
    from odc_pp.training.arguments import parse_args
    from odc_pp.training.components import build_components
    from odc_pp.training.distributed import Topology

    torch.cuda.set_device(0)
    job = parse_args(FLAGS).resolve(1)
    topo = Topology.for_job(job, 0, torch.device("cuda", 0))
    parts = build_components(job, topo, vocab_size=512)
    generator = torch.Generator().manual_seed(0)
    lengths = (100, 60, 96)  # three documents packed in one 256-token row
    microbatches = []
    for _ in range(4):
        tokens = torch.randint(0, 512, (1, 256), generator=generator)
        segments = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])[None]
        positions = torch.cat([torch.arange(n) for n in lengths])[None]
        microbatches.append(Microbatch(tokens=tokens, labels=tokens.roll(-1, 1),
                                       loss_mask=torch.ones(1, 256), position_ids=positions,
                                       segment_ids=segments))
    schedule = parts.schedules.training(len(microbatches))
    tokens = 4 * 256
    parts.runtime.run_minibatch(schedule, microbatches, global_num_tokens=tokens)  # warm-up
    run_action, errors = parts.runtime._run_action, []

    def checked(action):  # a list: a group of communication actions
        if isinstance(action, list) or action.kind.name not in COMPUTE:
            return run_action(action)
        torch.cuda.set_sync_debug_mode("error")
        try:
            return run_action(action)
        except RuntimeError as error:
            errors.append(f"{action.kind.name} mb {action.microbatch}: {error}"[:400])
            raise
        finally:
            torch.cuda.set_sync_debug_mode("default")

    parts.runtime._run_action = checked
    try:
        parts.runtime.run_minibatch(schedule, microbatches, global_num_tokens=tokens)
    except RuntimeError:
        pass
    parts.close()
    with open(out_path, "w") as handle:
        json.dump({"errors": errors}, handle)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_no_host_sync_inside_f_b_w(tmp_path):
    out = tmp_path / "sync.json"
    run_workers(worker, 1, str(out), config=LaunchConfig(timeout_s=300))
    errors = json.loads(out.read_text())["errors"]
    assert errors == [], errors
