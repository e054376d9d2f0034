"""The Hugging Face baseline of ``bench_gpu_step.py``: ``transformers.LlamaForCausalLM`` at the
same shape, on the same rows, SDPA attention, pure bf16 weights and fused AdamW (on CPU:
fp32, the stock AdamW), gradient accumulation over the global batch's microbatches. Steps
are timed with CUDA events (host clocks on CPU); FLOPs by the same formula as odc-pp's log
(:class:`odc_pp.planner.model.ModelShape`)."""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

__all__ = ["hf_worker"]


def _model(shape: dict, device, dtype):
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=shape["vocab_size"], hidden_size=shape["hidden_size"],
                         intermediate_size=shape["ffn_hidden_size"],
                         num_hidden_layers=shape["num_layers"],
                         num_attention_heads=shape["num_attention_heads"],
                         num_key_value_heads=shape["num_query_groups"],
                         max_position_embeddings=shape["seq_length"], rope_theta=500000.0,
                         tie_word_embeddings=False, attention_bias=False, mlp_bias=False)
    config._attn_implementation = "sdpa"
    return LlamaForCausalLM(config).to(device=device, dtype=dtype)


def hf_worker(shape: dict, rows_path: str, iters: int, out_path: str) -> int:
    import torch
    sys.path.insert(0, ROOT)
    from odc_pp.training.throughput import ModelShape, flops_per_microbatch
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    model = _model(shape, device, torch.bfloat16 if cuda else torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda)
    seq, batch = shape["seq_length"], shape["global_batch_size"]
    with open(rows_path) as handle:
        rows = [json.loads(line)["input_ids"][:seq] for line in handle]
    steps, losses, first = [], [], None
    for it in range(iters):
        ids = torch.tensor(rows[(it * batch) % len(rows):][:batch], device=device)
        start = time.perf_counter()
        if cuda:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
        total = 0.0
        for row in ids:
            loss = model(input_ids=row[None], labels=row[None]).loss / batch
            loss.backward()
            total += loss.detach()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if cuda:
            end.record()
            end.synchronize()
            seconds = begin.elapsed_time(end) / 1e3
        else:
            seconds = time.perf_counter() - start
        losses.append(float(total))
        if it == 0:
            first = time.perf_counter() - start
        steps.append(seconds)
    heads, groups, h = shape["num_attention_heads"], shape["num_query_groups"], shape["hidden_size"]
    flops_shape = ModelShape(num_layers=shape["num_layers"], hidden_size=h,
                             ffn_hidden_size=shape["ffn_hidden_size"],
                             vocab_size=shape["vocab_size"], num_attention_heads=heads,
                             num_query_groups=groups, gated_mlp=True)
    flops = flops_per_microbatch(flops_shape, batch, seq)
    steady = steps[2:] if len(steps) > 3 else steps[1:]
    step = statistics.median(steady)
    row = {"flags": "LlamaForCausalLM, sdpa, " + ("bf16 weights, AdamW(fused=True)" if cuda
                                                   else "fp32, AdamW"),
           "exit": 0, "iterations": iters, "first_iteration_s": first, "step_s": step,
           "step_s_range": [min(steady), max(steady)], "tokens_per_s": batch * seq / step,
           "tflops_per_device": flops / step / 1e12, "first_over_steady": first / step,
           "losses": [round(x, 4) for x in losses],
           "timing": "CUDA events" if cuda else "host clock"}
    if cuda:
        row["peak_allocated_gb"] = torch.cuda.max_memory_allocated() / 2 ** 30
        row["peak_reserved_gb"] = torch.cuda.max_memory_reserved() / 2 ** 30
    with open(out_path, "w") as handle:
        json.dump(row, handle)
    return 0
