"""The memory dry run of ``--dp-mode ddp`` at NVIDIA's Llama-3-8B layout
(tests/data/megatron_scripts/train_llama3_8b_h100_fp8.flags: tp1 pp1 dp8, bf16,
``--grad-reduce-in-bf16``, ``--use-distributed-optimizer``): replicated parameters and
gradients, optimizer state sharded over the eight replicas, as Megatron's distributed
optimizer holds them (its documented 4 + 16/d bytes per parameter for bf16 parameters and
bf16 gradients: 2 parameter + 2 gradient replicated; fp32 master, fp32 gradient and the
two AdamW moments sharded)."""

from __future__ import annotations

import pytest

from .test_param_residency import _dry_run

DP = 8


def _llama3_8b_params() -> int:
    """Trainable elements of Llama-3-8B (untied, GQA 32/8 heads, SwiGLU 14336, vocab
    128256), counted from its shape."""
    hidden, ffn, layers, vocab, kv = 4096, 14336, 32, 128256, 8 * 128
    per_layer = (hidden * (hidden + 2 * kv) + hidden * hidden  # qkv, output projection
                 + hidden * 2 * ffn + ffn * hidden  # gated fc1, fc2
                 + 2 * hidden)  # the two layernorms
    return 2 * vocab * hidden + layers * per_layer + hidden  # embedding, output, final norm


def test_ddp_dry_run_at_llama3_8b_is_replicated_plus_sharded():
    report = _dry_run(["--dp-mode", "ddp"])
    assert report.param_residency == "minibatch"  # ddp keeps every parameter resident
    params = _llama3_8b_params()
    gb = report.categories
    replicated = 2 * params + 2 * params  # bf16 parameters + bf16 main_grad
    sharded = 16 * params / DP  # fp32 master, fp32 gradient, two fp32 moments
    assert gb["params_gathered"] == pytest.approx(2 * params, rel=0.01)
    assert gb["weight_grads"] == pytest.approx(2 * params, rel=0.01)
    assert gb["optimizer_state"] == pytest.approx(12 * params / DP, rel=0.01)
    assert gb["params_sharded"] == 0  # each rank's shard is a slice of its replica
    state = sum(gb[name] for name in ("params_gathered", "params_sharded", "weight_grads",
                                      "grad_accumulators", "optimizer_state", "odc_staging"))
    assert state == pytest.approx(replicated + sharded, rel=0.05), \
        f"state {state / 1e9:.2f} GB vs replicated + sharded " \
        f"{(replicated + sharded) / 1e9:.2f} GB"
