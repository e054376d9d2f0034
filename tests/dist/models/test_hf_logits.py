"""Our megatron-core chunks loaded from tiny random HF models give transformers' logits
(fp32, <= 1e-5 relative) at pp=1 and through the pp=2 zbv split; packed rows give the
unpacked logits and losses; recomputing RMSNorm/SwiGLU gives the stored gradients (to
rounding: not bitwise, see odc_pp.megatron.recompute); a missing tensor is named."""

import json
import os

import pytest
import torch

from odc_pp.testing.launch import LaunchConfig, run_workers
from tests.dist.models._tiny import ARCHITECTURES, make_hf_model


def _relative(ours, theirs) -> float:
    return float((ours - theirs).abs().max() / theirs.abs().max())


def _chain(chunks_by_stage, microbatch):
    hidden = None
    for chunk in chunks_by_stage:
        hidden = chunk.logits_or_hidden(hidden, microbatch)
    return hidden


def worker(rank, world_size, root, out_path):
    from odc_pp.data import Microbatch
    from odc_pp.training.distributed import standalone_process_groups
    from odc_pp.megatron.hf import load_hf_weights, model_config_from_hf
    from odc_pp.megatron.hf_config import read_hf_config
    from odc_pp.megatron.model import build_chunks

    groups = standalone_process_groups()
    report = {}
    tokens = torch.randint(0, 96, (2, 24), generator=torch.Generator().manual_seed(1))
    microbatch = Microbatch(tokens=tokens)
    for kind in ARCHITECTURES:
        directory = os.path.join(root, kind)
        hf = make_hf_model(kind, directory, max_shard_size="20KB" if kind == "qwen3" else None)
        with torch.no_grad():
            expected = hf(tokens).logits
        config = read_hf_config(directory)
        tied = bool(config.get("tie_word_embeddings"))
        # pp = 1: one chunk (tied embeddings stay tied)
        model = model_config_from_hf(config)
        (chunk,) = build_chunks(model, pp_rank=0, pp_size=1, process_groups=groups)
        read = load_hf_weights([chunk], directory, model, tied_in_hf=tied)
        with torch.no_grad():
            ours = chunk.logits_or_hidden(None, microbatch)
        report[f"{kind}/pp1"] = _relative(ours, expected)
        report[f"{kind}/pp1_read_all"] = read == set(hf.state_dict()) - (
            {"lm_head.weight"} if tied else set())
        # pp = 2, zbv: 4 stages, V placement, chunks built per rank (tied: two copies)
        model = model_config_from_hf(config)
        stages = {}
        reads = []
        for pp_rank in range(2):
            chunks = build_chunks(model, pp_rank=pp_rank, pp_size=2, num_chunks=2,
                                  placement="v", process_groups=groups)
            reads.append(load_hf_weights(chunks, directory, model, tied_in_hf=tied))
            stages.update({c.stage: c for c in chunks})
        with torch.no_grad():
            ours = _chain([stages[s] for s in range(4)], microbatch)
        report[f"{kind}/zbv"] = _relative(ours, expected)
        # each rank read only its chunks' tensors: rank 1 (stages 1, 2) no embedding/head
        report[f"{kind}/zbv_rank1_partial"] = not any(
            "embed" in n or "lm_head" in n or n == "model.norm.weight" for n in reads[1]) \
            and len(reads[1]) < len(reads[0] | reads[1])
        # packing: two samples in one row == two rows
        a, b = tokens[0, :10], tokens[1, :14]
        packed = Microbatch(tokens=torch.cat([a, b])[None],
                            position_ids=torch.cat([torch.arange(10), torch.arange(14)])[None],
                            segment_ids=torch.cat([torch.zeros(10), torch.ones(14)]).long()[None])
        with torch.no_grad():
            row = _chain([stages[s] for s in range(4)], packed)[0]
            alone_a = hf(a[None]).logits[0]
            alone_b = hf(b[None]).logits[0]
        report[f"{kind}/packed"] = max(_relative(row[:10], alone_a),
                                       _relative(row[10:], alone_b))
    # packed and unpacked per-token losses (last stage, loss mask) are equal, and the
    # recomputing chunk (RMSNorm + SwiGLU recomputed in backward) gives the gradients of
    # the storing one
    directory = os.path.join(root, "llama")
    config = read_hf_config(directory)
    chunks = {}
    for recompute in (False, True):
        model = model_config_from_hf(config, recompute_lgd=recompute)
        (chunks[recompute],) = build_chunks(model, pp_rank=0, pp_size=1, process_groups=groups)
        load_hf_weights([chunks[recompute]], directory, model, tied_in_hf=False)
    samples = [torch.randint(0, 96, (n,), generator=torch.Generator().manual_seed(n))
               for n in (7, 12, 5)]
    separate = sum(float(chunks[False](None, Microbatch(tokens=s[None, :-1], labels=s[None, 1:])).sum())
                   for s in samples)
    packed = Microbatch(
        tokens=torch.cat([s[:-1] for s in samples])[None],
        labels=torch.cat([s[1:] for s in samples])[None],
        position_ids=torch.cat([torch.arange(len(s) - 1) for s in samples])[None],
        segment_ids=torch.cat([torch.full((len(s) - 1,), i) for i, s in enumerate(samples)])[None])
    report["packed_loss"] = abs(float(chunks[False](None, packed).sum()) - separate) / separate
    grads = {}
    for recompute, chunk in chunks.items():
        chunk(None, packed).sum().backward()
        grads[recompute] = {n: p.grad.clone() for n, p in chunk.global_named_parameters()}
    report["recompute_same_names"] = sorted(grads[True]) == sorted(grads[False])
    report["recompute_grad_rel"] = max(_relative(grads[True][n], grads[False][n])
                                       for n in grads[False])
    # the SDPA core attention (CUDA's; it runs on CPU too) equals the host attention,
    # causal (no mask) and packed (segment mask), with GQA
    model = model_config_from_hf(config, attention_backend="sdpa")
    (sdpa,) = build_chunks(model, pp_rank=0, pp_size=1, process_groups=groups)
    load_hf_weights([sdpa], directory, model, tied_in_hf=False)
    with torch.no_grad():
        report["sdpa_causal"] = _relative(sdpa.logits_or_hidden(None, microbatch),
                                          chunks[False].logits_or_hidden(None, microbatch))
        report["sdpa_packed"] = _relative(sdpa.logits_or_hidden(None, packed),
                                          chunks[False].logits_or_hidden(None, packed))
    from odc_pp.megatron.compat import SdpaDotProductAttention

    report["sdpa_is_sdpa"] = isinstance(  # (its keyed-dropout subclass)
        sdpa.model.decoder.layers[0].self_attention.core_attention, SdpaDotProductAttention)
    # a missing tensor is named
    directory = os.path.join(root, "llama")
    from safetensors.torch import load_file, save_file
    broken = os.path.join(root, "broken")
    os.makedirs(broken)
    state = {}
    for name in os.listdir(directory):
        if name.endswith(".safetensors"):
            state.update(load_file(os.path.join(directory, name)))
    del state["model.layers.2.mlp.up_proj.weight"]
    save_file(state, os.path.join(broken, "model.safetensors"))
    with open(os.path.join(directory, "config.json")) as src, \
            open(os.path.join(broken, "config.json"), "w") as dst:
        dst.write(src.read())
    config = read_hf_config(broken)
    model = model_config_from_hf(config)
    (chunk,) = build_chunks(model, pp_rank=0, pp_size=1, process_groups=groups)
    try:
        load_hf_weights([chunk], broken, model, tied_in_hf=False)
        report["missing"] = "no error"
    except ValueError as exc:
        report["missing"] = str(exc)
    with open(out_path, "w") as handle:
        json.dump(report, handle)


@pytest.mark.multiproc
def test_logits_match_transformers(tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "report.json"
    run_workers(worker, 1, str(tmp_path), str(out), config=LaunchConfig(timeout_s=300))
    report = json.loads(out.read_text())
    for kind in ARCHITECTURES:
        assert report[f"{kind}/pp1"] <= 1e-5, (kind, report)
        assert report[f"{kind}/zbv"] <= 1e-5, (kind, report)
        assert report[f"{kind}/packed"] <= 1e-5, (kind, report)
        assert report[f"{kind}/pp1_read_all"], kind
        assert report[f"{kind}/zbv_rank1_partial"], kind
    assert "model.layers.2.mlp.up_proj.weight" in report["missing"], report["missing"]
    assert report["packed_loss"] <= 1e-6, report["packed_loss"]
    assert report["recompute_same_names"]
    assert report["sdpa_is_sdpa"]
    assert report["sdpa_causal"] <= 1e-5 and report["sdpa_packed"] <= 1e-5, report
    assert report["recompute_grad_rel"] <= 1e-5, report["recompute_grad_rel"]
