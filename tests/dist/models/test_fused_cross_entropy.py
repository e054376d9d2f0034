"""A GPT chunk with ``fused_cross_entropy="on"`` (odc_pp.megatron.linear_cross_entropy)
against ``"off"``: the same per-token losses and every parameter's gradient under the
runtime's masked loss, untied and tied (one chunk sharing the embedding); and the
frontend flag reaching the model config."""

import json

import pytest
import torch

from odc_pp.testing.launch import LaunchConfig, run_workers


def _worker(rank, world_size, out_path):
    from odc_pp.data import Microbatch
    from odc_pp.training.distributed import standalone_process_groups
    from odc_pp.megatron.model import ModelConfig, build_chunks
    from odc_pp.training.arguments import parse_args
    from odc_pp.training.model_setup import model_config

    groups = standalone_process_groups()
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 96, (2, 12), generator=gen)
    microbatch = Microbatch(tokens=tokens, labels=torch.roll(tokens, -1, 1),
                            loss_mask=(torch.rand(2, 12, generator=gen) > 0.2).float())
    report = {}
    for tie in (False, True):
        results = {}
        for setting in ("off", "on"):
            config = ModelConfig(vocab_size=96, hidden_size=32, num_layers=2,
                                 num_attention_heads=4, num_query_groups=2,
                                 max_sequence_length=12, normalization="RMSNorm",
                                 activation="swiglu", position_embedding_type="rope",
                                 add_bias_linear=False, tie_embeddings=tie,
                                 fused_cross_entropy=setting)
            (chunk,) = build_chunks(config, pp_size=1, pp_rank=0, seed=3,
                                    process_groups=groups)
            losses = chunk(None, microbatch)
            ((losses * microbatch.loss_mask).sum() / 17.0).backward()
            results[setting] = (chunk.fused_cross_entropy, losses.detach(),
                                {n: p.grad.clone() for n, p in chunk.named_parameters()})
        (off_flag, off_loss, off_grads), (on_flag, on_loss, on_grads) = \
            results["off"], results["on"]
        report[f"tied={tie}"] = {
            "flags": [off_flag, on_flag], "names_equal": off_grads.keys() == on_grads.keys(),
            "loss": float((on_loss - off_loss).abs().max()),
            "grad": max(float((on_grads[n] - off_grads[n]).abs().max()
                              / off_grads[n].abs().max().clamp_min(1e-30)) for n in off_grads)}
    args = parse_args(["--mock-data", "--vocab-size", "64", "--fused-cross-entropy", "on"])
    report["cli"] = model_config(args.model, vocab_size=64, device="cpu",
                                 num_stages=1).fused_cross_entropy
    with open(out_path, "w") as handle:
        json.dump(report, handle)


@pytest.mark.multiproc
def test_fused_cross_entropy_matches_the_unfused_model(tmp_path):
    out = tmp_path / "report.json"
    run_workers(_worker, 1, str(out), config=LaunchConfig(timeout_s=300))
    report = json.loads(out.read_text())
    assert report.pop("cli") == "on"
    for case, row in report.items():
        assert row["flags"] == [False, True], case
        assert row["names_equal"], case
        assert row["loss"] <= 1e-6 and row["grad"] <= 1e-5, (case, row)
