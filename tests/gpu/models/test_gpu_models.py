"""On CUDA: the SDPA core attention (causal and packed) and RoPE give the CPU host
attention's logits and gradients for a tiny random Llama (skipped without a GPU)."""

import json

import pytest
import torch

from odc_pp.testing.launch import LaunchConfig, run_workers
from tests.dist.models._tiny import make_hf_model


def worker(rank, world_size, root, out_path):
    from odc_pp.data import Microbatch
    from odc_pp.training.distributed import standalone_process_groups
    from odc_pp.megatron.hf import load_hf_weights, model_config_from_hf
    from odc_pp.megatron.hf_config import read_hf_config
    from odc_pp.megatron.model import build_chunks

    groups = standalone_process_groups()
    make_hf_model("llama", root)
    config = read_hf_config(root)
    tokens = torch.randint(0, 96, (2, 24), generator=torch.Generator().manual_seed(1))
    packed = Microbatch(tokens=tokens, labels=tokens,
                        position_ids=torch.cat([torch.arange(10), torch.arange(14)]).repeat(2, 1),
                        segment_ids=torch.cat([torch.zeros(10), torch.ones(14)]).long().repeat(2, 1))
    plain = Microbatch(tokens=tokens, labels=tokens)
    report = {}
    results = {}
    for device in ("cpu", "cuda"):
        model = model_config_from_hf(config, device=device)
        (chunk,) = build_chunks(model, pp_rank=0, pp_size=1, process_groups=groups)
        load_hf_weights([chunk], root, model, tied_in_hf=False)
        report[f"{device}_attention"] = next(  # the compat class under the keyed subclass
            cls.__name__ for cls in type(
                chunk.model.decoder.layers[0].self_attention.core_attention).__mro__
            if cls.__module__ == "odc_pp.megatron.compat")
        for name, microbatch in (("plain", plain), ("packed", packed)):
            chunk.zero_grad(set_to_none=True)
            loss = chunk(None, microbatch).sum()
            loss.backward()
            results[(device, name)] = (float(loss), {n: p.grad.detach().cpu() for n, p
                                                      in chunk.global_named_parameters()})
    for name in ("plain", "packed"):
        (loss_cpu, grads_cpu), (loss_gpu, grads_gpu) = results[("cpu", name)], \
            results[("cuda", name)]
        report[f"{name}_loss_rel"] = abs(loss_gpu - loss_cpu) / abs(loss_cpu)
        report[f"{name}_grad_rel"] = max(
            float((grads_gpu[n] - grads_cpu[n]).abs().max() / grads_cpu[n].abs().max())
            for n in grads_cpu)
    with open(out_path, "w") as handle:
        json.dump(report, handle)


@pytest.mark.gpu
@pytest.mark.multiproc
def test_sdpa_and_rope_on_cuda_match_cpu(tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "report.json"
    run_workers(worker, 1, str(tmp_path / "hf"), str(out), config=LaunchConfig(timeout_s=300))
    report = json.loads(out.read_text())
    assert report["cuda_attention"] == "SdpaDotProductAttention", report
    assert report["cpu_attention"] == "HostDotProductAttention", report
    for name in ("plain", "packed"):
        # TF32 may be on for matmuls: a loose but meaningful bound
        assert report[f"{name}_loss_rel"] <= 1e-3, report
        assert report[f"{name}_grad_rel"] <= 1e-2, report
