"""--fused-rope moves the rotation from megatron's SelfAttention into the SDPA core
attention (odc_pp.megatron.rope_triton.RotaryInAttention): the same model. On CPU the
rotation inside the core attention runs megatron's eager formula (the Triton kernel is
checked on CUDA by tests/gpu/models/test_rope_triton_gpu.py), so logits and gradients must
equal those of megatron's own placement, on full rows and on packed rows with per-row
positions."""

from __future__ import annotations

import json

import pytest
import torch

from odc_pp.testing.launch import LaunchConfig, run_workers


def _worker(rank, world_size, out_path):
    from odc_pp.data import Microbatch
    from odc_pp.megatron import rope_triton
    from odc_pp.training.distributed import standalone_process_groups
    from odc_pp.megatron.model import ModelConfig, build_chunks

    rope_triton.RotaryInAttention.apply = lambda self, q, k: (
        rope_triton.eager_rope(q, self.freqs), rope_triton.eager_rope(k, self.freqs))
    groups = standalone_process_groups()
    tokens = torch.randint(0, 64, (2, 24), generator=torch.Generator().manual_seed(3))
    segments = torch.tensor([[0] * 9 + [1] * 15, [0] * 20 + [1] * 4])
    positions = torch.stack([torch.cat([torch.arange(n) for n in lengths])
                             for lengths in ([9, 15], [20, 4])])
    rows = {"full": Microbatch(tokens=tokens, labels=tokens),
            "packed": Microbatch(tokens=tokens, labels=tokens, position_ids=positions,
                                 segment_ids=segments)}
    config = ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_attention_heads=4,
                         num_query_groups=2, ffn_hidden_size=48, normalization="RMSNorm",
                         activation="swiglu", position_embedding_type="rope",
                         add_bias_linear=False, max_sequence_length=32,
                         attention_backend="sdpa", packed_attention="dense")
    report = {}
    for name, microbatch in rows.items():
        results = []
        for fused in (False, True):
            (chunk,) = build_chunks(config, pp_rank=0, pp_size=1, seed=7,
                                    process_groups=groups)
            assert chunk.fused_rope is False  # CPU: auto keeps megatron's placement
            chunk.fused_rope = fused
            logits = chunk.logits_or_hidden(None, microbatch)
            logits.square().mean().backward()
            results.append((logits.detach(), {n: p.grad.clone()
                                              for n, p in chunk.global_named_parameters()}))
        (base, base_grads), (moved, moved_grads) = results
        report[name] = max([float((moved - base).abs().max())] +
                           [float((moved_grads[n] - g).abs().max()) for n, g in base_grads.items()])
    with open(out_path, "w") as handle:
        json.dump(report, handle)


@pytest.mark.multiproc
def test_rope_in_core_attention_is_the_same_model(tmp_path):
    out = tmp_path / "report.json"
    run_workers(_worker, 1, str(out), config=LaunchConfig(timeout_s=240))
    report = json.loads(out.read_text())
    assert set(report) == {"full", "packed"}
    assert all(value <= 1e-6 for value in report.values()), report
