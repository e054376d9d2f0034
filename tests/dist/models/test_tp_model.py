"""Tensor and sequence parallelism at the model level (2 processes, gloo): losses and
full gradients equal the tp=1 model's, with the B/W split (deferred W) equal to the plain
backward, for GPT (LayerNorm, GeLU, biases) and Llama-style (RMSNorm, SwiGLU, GQA, RoPE,
q/k norm) models, the latter also with zero-centred norms (--apply-layernorm-1p); the tp
layout table round-trips."""

import json

import pytest
import torch

from odc_pp.testing.launch import LaunchConfig, run_workers
from tests.dist.runtime._parity import make_microbatches, model_config

LLAMA = dict(normalization="RMSNorm", activation="swiglu", num_query_groups=2,
             position_embedding_type="rope", add_bias_linear=False, add_qkv_bias=True,
             qk_layernorm=True, ffn_hidden_size=96)


def _full_grads(chunk, tp):
    """Unsharded gradients by global name (gathers the shards of every tp rank)."""
    import torch.distributed as dist

    from odc_pp.megatron.tp_layout import partition_of

    grads = {}
    for name, param in chunk.global_named_parameters():
        grad = param.grad.detach().clone()
        partition = partition_of(name, gated_mlp="linear_fc1" in name and chunk.gated)
        if tp.size > 1 and not partition.replicated:
            shards = [torch.empty_like(grad) for _ in range(tp.size)]
            dist.all_gather(shards, grad, group=tp.group)
            grad = partition.unshard(shards)
        grads[name] = grad
    return grads


def worker(rank, world_size, out_path, arch, sequence_parallel, keep, recompute):
    import torch.distributed as dist

    from odc_pp.training.distributed import standalone_process_groups
    from odc_pp.megatron.model import build_chunks
    from odc_pp.megatron.tp import TensorParallel
    from odc_pp.runtime import WeightGradQueue

    extra = dict(LLAMA) if arch.startswith("llama") else {}
    if arch == "llama_1p":
        extra["apply_layernorm_1p"] = True
    config = model_config(recompute_lgd=recompute, **extra)
    microbatches = make_microbatches(2, equal_lengths=True)
    # the tp=1 reference, built on every rank
    (reference,) = build_chunks(config, pp_rank=0, pp_size=1, seed=3,
                                process_groups=standalone_process_groups())
    reference.gated = config.activation == "swiglu"
    ref_losses = []
    for mb in microbatches:
        loss = (reference(None, mb) * mb.loss_mask).sum()
        loss.backward()
        ref_losses.append(float(loss))
    ref_grads = {n: p.grad for n, p in reference.global_named_parameters()}

    tp = TensorParallel(group=dist.new_group([0, 1]), sequence_parallel=sequence_parallel,
                        keep_sp_input_for_w=keep)
    (chunk,) = build_chunks(config, pp_rank=0, pp_size=1, seed=3, tensor_parallel=tp,
                            process_groups=standalone_process_groups(tp=tp.group))
    chunk.gated = config.activation == "swiglu"
    report = {"losses": [], "ref_losses": ref_losses}
    queue = WeightGradQueue()
    queue.attach(0, chunk)
    for index, mb in enumerate(microbatches):
        loss = (chunk(None, mb) * mb.loss_mask).sum()
        report["losses"].append(float(loss))
        if index == 0:
            loss.backward()  # plain backward
        else:
            with queue.deferring(0, index):  # B now, W later
                loss.backward()
            before = {n: p.grad.clone() for n, p in chunk.global_named_parameters()}
            queue.flush(0, index)
            report["deferred"] = sorted(n for n, p in chunk.global_named_parameters()
                                        if not torch.equal(p.grad, before[n]))
    grads = _full_grads(chunk, tp)
    report["grad_rel"] = max(float((grads[n] - g).norm() / g.norm().clamp_min(1e-12))
                             for n, g in ref_grads.items())
    report["names_equal"] = sorted(grads) == sorted(ref_grads)
    with open(f"{out_path}.{rank}", "w") as handle:
        json.dump(report, handle)


@pytest.mark.multiproc
@pytest.mark.parametrize("arch,sequence_parallel,keep,recompute", [
    ("gpt", False, False, False),
    ("gpt", True, False, False),
    ("gpt", True, True, True),
    ("llama", False, False, False),
    ("llama", True, False, True),
    ("llama_1p", True, False, True),
])
def test_tp_matches_tp1(tmp_path, arch, sequence_parallel, keep, recompute):
    out = tmp_path / "tp.json"
    run_workers(worker, 2, str(out), arch, sequence_parallel, keep, recompute,
                config=LaunchConfig(timeout_s=180))
    for rank in range(2):
        report = json.loads((tmp_path / f"tp.json.{rank}").read_text())
        assert report["names_equal"]
        for loss, ref in zip(report["losses"], report["ref_losses"]):
            assert abs(loss - ref) <= 1e-5 * abs(ref), (loss, ref)
        assert report["grad_rel"] < 1e-5, report
        # W really was deferred: exactly the linears' weights changed in W (the decoder's
        # and the output layer's)
        assert report["deferred"] and all(name.endswith((
            "linear_qkv.weight", "linear_proj.weight", "linear_fc1.weight",
            "linear_fc2.weight", "output_layer.weight")) for name in report["deferred"]), \
            report["deferred"]
        assert "model.output_layer.weight" in report["deferred"]


def test_layout_table_round_trips():
    from odc_pp.megatron.tp_layout import grad_is_partial, partition_of, shard, unshard

    full = torch.arange(8 * 6.).view(8, 6)
    for name, gated in (("model.decoder.layers.0.mlp.linear_fc1.weight", True),
                        ("model.decoder.layers.0.self_attention.linear_qkv.weight", False),
                        ("model.decoder.layers.0.mlp.linear_fc2.weight", False),
                        ("model.decoder.final_layernorm.weight", False)):
        shards = [shard(name, full, rank=r, size=2, gated_mlp=gated) for r in range(2)]
        assert torch.equal(unshard(name, shards, gated_mlp=gated), full)
    gate_up = [shard("x.linear_fc1.weight", full, rank=r, size=2, gated_mlp=True)
               for r in range(2)]
    assert torch.equal(gate_up[0], torch.cat((full[0:2], full[4:6])))  # [gate_0; up_0]
    assert partition_of("m.output_layer.weight", gated_mlp=False).dim == 0
    assert partition_of("m.decoder.layers.1.self_attention.linear_proj.weight",
                        gated_mlp=False).dim == 1
    assert partition_of("m.decoder.layers.1.self_attention.linear_proj.bias",
                        gated_mlp=False).replicated
    assert grad_is_partial("m.decoder.layers.1.self_attention.linear_proj.bias", tp_size=2,
                           sequence_parallel=True)
    assert not grad_is_partial("m.decoder.layers.1.self_attention.linear_proj.bias",
                               tp_size=2, sequence_parallel=False)
    assert grad_is_partial("m.decoder.layers.1.self_attention.q_layernorm.weight", tp_size=2,
                           sequence_parallel=False)
    with pytest.raises(ValueError, match="does not split"):
        shard("m.output_layer.weight", torch.zeros(7, 2), rank=0, size=2, gated_mlp=False)
