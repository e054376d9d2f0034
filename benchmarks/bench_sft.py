"""Tokens/s of tiny-Llama SFT on CPU, pp=2 (ZB-V) x dp=2 (ODC, LB-Mini), with and without
--pack-sequences.

A tiny random Llama (4 layers, hidden 64, GQA, Llama-3 RoPE) is made locally with
transformers (save_pretrained, no download) and fine-tuned from it with
``pretrain_gpt.py --hf-checkpoint`` on pre-tokenized JSONL with long-tailed sample lengths
(prompt predictions masked). Both configurations run the same samples, seed and token cap
per microbatch, alternating in rounds so load from other processes hits them alike;
tokens/s is the log's (real tokens, padding excluded) over the iterations after the first
(warm-up), median over rounds.

    .venv/bin/python benchmarks/bench_sft.py --json

Needs the data side of packing (pre-tokenized JSONL and ``--pack-sequences`` in
odc_pp.data / odc_pp.training.data_plan).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from odc_pp.testing.torchrun import launch  # noqa: E402  (the one torchrun launcher)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--token-cap", type=int, default=512,
                        help="--max-tokens-per-microbatch")
    parser.add_argument("--global-batch", type=int, default=32)
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results",
                                                      "sft_cpu.json"))
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    return parser.parse_args(argv)


def make_model_and_data(directory: str, seq: int) -> tuple[str, str]:
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=264, hidden_size=64, intermediate_size=172, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=seq,
        rope_theta=500000.0, tie_word_embeddings=False, torch_dtype="float32",
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    hf = os.path.join(directory, "hf")
    transformers.LlamaForCausalLM(config).save_pretrained(hf)
    data = os.path.join(directory, "sft.jsonl")
    rng = random.Random(0)
    with open(data, "w") as handle:
        for _ in range(512):
            length = int(min(seq + 1, max(8, rng.lognormvariate(3.6, 0.8))))
            prompt = rng.randint(2, max(2, length // 3))
            ids = [rng.randrange(1, 256) for _ in range(length)]
            mask = [0] * (prompt - 1) + [1] * (length - prompt)
            handle.write(json.dumps({"input_ids": ids, "loss_mask": mask}) + "\n")
    return hf, data


def run_once(args, hf: str, data: str, packed: bool, tmp, name: str) -> dict:
    flags = ["--hf-checkpoint", hf, "--data-path", data, "--seq-length", str(args.seq),
             "--micro-batch-size", "1", "--global-batch-size", str(args.global_batch),
             "--max-tokens-per-microbatch", str(args.token_cap),
             "--pipeline-model-parallel-size", "2", "--pipeline-schedule", "zbv",
             "--dp-mode", "odc", "--load-balance", "lb-mini", "--lr", "1e-3",
             "--train-iters", str(args.iters), "--seed", "1234", "--no-progress-bar",
             "--distributed-timeout-minutes", "3"] + (["--pack-sequences"] if packed else [])
    run = launch(flags, nproc=4, tmp_path=tmp, name=name, timeout=600, launcher="torchrun")
    if run.returncode != 0:
        raise RuntimeError(run.describe())
    records = run.records()[1:]
    return {"tokens_per_s": statistics.mean(r["tokens_per_s"] for r in records),
            "step_s": statistics.mean(r["step_s"] for r in records),
            "microbatches_per_replica": records[-1]["microbatches_per_replica"],
            "losses": [r["loss"] for r in run.records()]}


def main(argv=None):
    args = parse_args(argv)
    from pathlib import Path

    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)
        hf, data = make_model_and_data(directory, args.seq)
        runs = {"unpacked": [], "packed": []}
        for round_ in range(args.rounds):
            for name in runs:
                runs[name].append(run_once(args, hf, data, name == "packed", tmp,
                                           f"{name}_{round_}"))
    result = {"config": {k: v for k, v in vars(args).items() if k not in ("json", "out")},
              "machine": {"cpus": os.cpu_count(), "ranks": 4, "torch_threads_per_rank": 1}}
    for name, rounds in runs.items():
        result[name] = {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in rounds),
                        "step_s": statistics.median(r["step_s"] for r in rounds),
                        "tokens_per_s_rounds": [r["tokens_per_s"] for r in rounds],
                        "microbatches_per_replica": rounds[-1]["microbatches_per_replica"],
                        "losses": rounds[-1]["losses"]}
    result["packed_speedup"] = result["packed"]["tokens_per_s"] / \
        result["unpacked"]["tokens_per_s"]
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as handle:
        json.dump(result, handle, indent=1)
    if args.json:
        print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
