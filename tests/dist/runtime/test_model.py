"""megatron-core GPT chunks on CPU: layout-independent init, B+W == BW == plain autograd."""

import json

import pytest
import torch

from odc_pp.testing.launch import LaunchConfig, run_workers
from tests.dist.runtime._parity import make_microbatches, model_config


def worker(rank, world_size, out_path):
    from odc_pp.training.distributed import standalone_process_groups
    from odc_pp.megatron.model import build_chunks
    from odc_pp.runtime import WeightGradQueue

    groups = standalone_process_groups()
    config = model_config()
    (full,) = build_chunks(config, pp_rank=0, pp_size=1, seed=5, process_groups=groups)
    reference = dict(full.global_named_parameters())
    report = {}
    for pp, num_chunks, placement in [(2, 1, "interleaved"), (4, 2, "v"), (2, 2, "interleaved")]:
        merged = {}
        for rank_ in range(pp):
            for chunk in build_chunks(config, pp_rank=rank_, pp_size=pp, num_chunks=num_chunks,
                                      placement=placement, seed=5, process_groups=groups):
                merged.update(dict(chunk.global_named_parameters()))
        report[f"{pp}-{num_chunks}-{placement}"] = (
            sorted(merged) == sorted(reference)
            and all(torch.equal(merged[name], reference[name]) for name in reference))
    (other_seed,) = build_chunks(config, pp_rank=0, pp_size=1, seed=6, process_groups=groups)
    report["seed_matters"] = not torch.equal(
        dict(other_seed.global_named_parameters())["model.decoder.layers.3.mlp.linear_fc1.weight"],
        reference["model.decoder.layers.3.mlp.linear_fc1.weight"])

    # tied across stages: the last stage's output layer is a shared_embedding copy
    # initialised from the embedding's name (both copies start equal)
    from dataclasses import replace

    from odc_pp.megatron.model import tied_embedding_params

    tied = replace(config, tie_embeddings=True)
    (first,) = build_chunks(tied, pp_rank=0, pp_size=2, seed=5, process_groups=groups)
    (last,) = build_chunks(tied, pp_rank=1, pp_size=2, seed=5, process_groups=groups)
    output = last.model.output_layer.weight
    report["tied_copies_equal"] = bool(getattr(output, "shared_embedding", False)) and \
        torch.equal(first.model.embedding.word_embeddings.weight, output)
    report["tied_params"] = (
        tied_embedding_params([first]) == [(0, "model.embedding.word_embeddings.weight")]
        and tied_embedding_params([last]) == [(0, "model.output_layer.weight")]
        and tied_embedding_params([full]) == [])
    report["untied_differ"] = not torch.equal(reference["model.output_layer.weight"],
                                              reference["model.embedding.word_embeddings.weight"])

    # split backward on the real model: B (deferred) then W equals plain autograd
    microbatch = make_microbatches(1)[0]
    full(None, microbatch).sum().backward()
    expected = {name: p.grad.clone() for name, p in full.global_named_parameters()}
    full.zero_grad(set_to_none=True)
    queue = WeightGradQueue()
    report["bound_layers"] = queue.attach(0, full)
    loss = full(None, microbatch).sum()
    with queue.deferring(0, 0):
        loss.backward()
    deferred = [name for name, p in full.global_named_parameters() if p.grad is None]
    report["deferred_are_linear_weights"] = bool(deferred) and all(
        name.endswith(("linear_qkv.weight", "linear_proj.weight", "linear_fc1.weight",
                       "linear_fc2.weight", "output_layer.weight")) for name in deferred)
    report["output_layer_deferred"] = "model.output_layer.weight" in deferred
    queue.flush(0, 0)
    report["split_matches"] = all(
        torch.allclose(p.grad, expected[name], rtol=1e-5, atol=1e-7)
        for name, p in full.global_named_parameters())
    with open(out_path, "w") as handle:
        json.dump(report, handle)


@pytest.mark.multiproc
def test_layout_independent_init_and_split_backward(tmp_path):
    out = tmp_path / "model.json"
    run_workers(worker, 1, str(out), config=LaunchConfig(timeout_s=120))
    report = json.loads(out.read_text())
    assert report.pop("bound_layers") == 8 * 4 + 1  # 4 linears per layer + output layer
    assert all(report.values()), report
