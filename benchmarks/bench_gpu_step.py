#!/usr/bin/env python3
"""One GPU's training step at the Llama-3-8B layer shape (issue 29): odc-pp's runs against a
plain Hugging Face step on the same rows, in one call.

Shape (``SHAPE``): 4 layers, h 4096, ffn 14336, 32 heads / 8 KV groups, vocabulary 128256
untied, RoPE, RMSNorm, SwiGLU, no bias; seq 8192, micro-batch 1, global batch 8, bf16,
pp=1, dp=1. Runs (``RUNS``; each names its flags in the JSON):

* ``full-1f1b`` / ``full-zbv``: full 8192-token pre-tokenized documents (``--data-path``);
* ``lbmini-packed``: the default post-training path (``--load-balance lb-mini``, packed
  rows) on the built-in long-tailed corpus (``--mock-data``: log-normal, median seq/4);
* ``unpacked``: the same corpus, one sample per row, micro-batch 1;
* ``hf``: ``transformers.LlamaForCausalLM`` (SDPA, pure bf16 weights, fused AdamW) on the
  full rows, timed with CUDA events, in its own process.

Each odc-pp run is ``pretrain_gpt.py`` with ``--log-json``: the steady step is the median of
the iterations after the first two; tokens/s and MFU come from the log record (real tokens;
Megatron-LM's FLOPs formula with GQA and SwiGLU, per document for packed rows:
``odc_pp.training.throughput``), the memory from ``peak_allocated_mb`` /
``peak_memory_mb`` (reserved), both with the ODC transport's CUDA symmetric buffers
(``symmetric_mb``: cudaMalloc-ed outside torch's allocator, so before 2026-11-27 the
records missed them: 11.5 GB at this shape). The dry run of the same flags (``--dry-run``) gives the
predicted peak. ``--tiny`` runs the same pipeline at a small shape (a CPU self-test).

Output: ``--out`` (default ``benchmarks/results/gpu_step.json``), rewritten after each run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPE = dict(num_layers=4, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
             num_query_groups=8, vocab_size=128256, seq_length=8192, global_batch_size=8)
TINY = dict(num_layers=2, hidden_size=64, ffn_hidden_size=176, num_attention_heads=4,
            num_query_groups=2, vocab_size=512, seq_length=128, global_batch_size=4)
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0}
"""Dense bf16 peak (the issue's MFU denominator)."""
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_step_verdicts import TARGETS, verdicts  # noqa: E402  (issue 50's targets)


def model_flags(shape: dict) -> list[str]:
    return ["--num-layers", str(shape["num_layers"]), "--hidden-size", str(shape["hidden_size"]),
            "--ffn-hidden-size", str(shape["ffn_hidden_size"]),
            "--num-attention-heads", str(shape["num_attention_heads"]),
            "--group-query-attention", "--num-query-groups", str(shape["num_query_groups"]),
            "--vocab-size", str(shape["vocab_size"]), "--untie-embeddings-and-output-weights",
            "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
            "--disable-bias-linear", "--seq-length", str(shape["seq_length"]),
            "--max-position-embeddings", str(shape["seq_length"]),
            "--micro-batch-size", "1", "--global-batch-size", str(shape["global_batch_size"]),
            "--lr", "1e-4", "--min-lr", "1e-5", "--lr-warmup-iters", "1", "--seed", "7",
            "--no-progress-bar", "--log-interval", "1", "--pipeline-model-parallel-size", "1",
            "--hidden-dropout", "0", "--attention-dropout", "0"]  # as HF Llama / the recipe


def runs(shape: dict, rows_path: str, bf16: bool) -> dict[str, list[str]]:
    """Each odc-pp run's flags beyond the model's."""
    dtype = ["--bf16"] if bf16 else []
    full = ["--data-path", rows_path, "--tokenizer-type", "ByteLevelTokenizer", *dtype]
    mock = ["--mock-data", *dtype]
    return {"full-1f1b": full + ["--pipeline-schedule", "1f1b"],
            "lbmini-packed": mock + ["--pipeline-schedule", "1f1b", "--load-balance", "lb-mini"],
            "unpacked": mock + ["--pipeline-schedule", "1f1b"],
            "full-zbv": full + ["--pipeline-schedule", "zbv"]}


EXPANDABLE = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
UNFUSED = ["--fused-cross-entropy", "off"]
VARIANTS = {"unpacked-expandable": ("unpacked", EXPANDABLE, []),
            "lbmini-packed-expandable": ("lbmini-packed", EXPANDABLE, []),
            "full-1f1b-expandable": ("full-1f1b", EXPANDABLE, []),
            "full-1f1b-unfused-ce": ("full-1f1b", None, UNFUSED),
            "lbmini-packed-unfused-ce": ("lbmini-packed", None, UNFUSED),
            "full-1f1b-layer": ("full-1f1b", None, ["--odc-param-residency", "layer"])}
"""A/B runs: a run's flags under another environment (the caching allocator's expandable
segments: variable shapes without cudaMalloc/cudaFree churn near the memory limit) or
with extra flags (the unfused output layer + loss; FSDP-style per-layer parameter
residency). Any run name + ``-profile`` runs it under ``gpu_step_profile.py`` (iterations
3-4 under torch.profiler; the summary goes into the row's ``profile``)."""
PROFILED = (3, 5)
"""The profiled iterations [start, stop) of a ``-profile`` run."""


def write_rows(path: str, shape: dict, count: int, seed: int = 0) -> None:
    """``count`` pre-tokenized documents of exactly seq + 1 ids (full rows)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    with open(path, "w") as handle:
        for _ in range(count):
            ids = rng.integers(1, shape["vocab_size"], shape["seq_length"] + 1)
            handle.write(json.dumps({"input_ids": ids.tolist()}) + "\n")


def _run(cmd: list[str], timeout_s: float, log_path: str,
         env: dict | None = None) -> tuple[int, str]:
    started = time.monotonic()
    try:
        done = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True, check=False,
                              timeout=max(timeout_s, 1), env={**os.environ, **(env or {})})
        output, status = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as exc:
        output, status = f"{exc.stdout or ''}{exc.stderr or ''}\nTIMEOUT after {timeout_s:.0f} s", 124
    with open(log_path, "w") as handle:
        handle.write(f"$ {' '.join(cmd)}\n{output}\n# {time.monotonic() - started:.1f} s\n")
    return status, output


def summarize(records: list[dict], peak_tflops: float | None) -> dict:
    """The steady step (iterations after the first two) of a run's log records."""
    steady = records[2:] if len(records) > 3 else records[1:]
    step = statistics.median(r["step_s"] for r in steady)
    tokens = statistics.median(r["tokens_per_s"] for r in steady)
    tflops = statistics.median(r["tflops_per_device"] for r in steady)
    return {"iterations": len(records), "first_iteration_s": records[0]["step_s"],
            "step_s": step, "step_s_range": [min(r["step_s"] for r in steady),
                                             max(r["step_s"] for r in steady)],
            "tokens_per_s": tokens, "tflops_per_device": tflops,
            "mfu": tflops / peak_tflops if peak_tflops else None,
            "first_over_steady": records[0]["step_s"] / step,
            "peak_allocated_gb": max(r.get("peak_allocated_mb", 0) for r in records) / 1024,
            "peak_reserved_gb": max(r["peak_memory_mb"] for r in records) / 1024,
            "symmetric_gb": max(r.get("symmetric_mb", 0) for r in records) / 1024,
            "losses": [round(r["loss"], 4) for r in records]}


def odc_run(name: str, flags: list[str], *, iters: int, work: str, timeout_s: float,
            peak_tflops: float | None, env: dict | None = None,
            profile: bool = False) -> dict:
    log_json = os.path.join(work, f"{name}.jsonl")
    entry = ["pretrain_gpt.py"]
    if profile:
        iters = max(iters, PROFILED[1] + 1)
        entry = ["benchmarks/gpu_step_profile.py", "--out", os.path.join(work, f"{name}.json"),
                 "--start", str(PROFILED[0]), "--stop", str(PROFILED[1]), "--"]
    cmd = [sys.executable, *entry, *flags, "--train-iters", str(iters),
           "--log-json", log_json]
    status, output = _run(cmd, timeout_s, os.path.join(work, f"{name}.log"), env)
    result = {"flags": flags, "exit": status, **({"env": env} if env else {})}
    if profile and os.path.exists(os.path.join(work, f"{name}.json")):
        with open(os.path.join(work, f"{name}.json")) as handle:
            result["profile"] = json.load(handle)
    if os.path.exists(log_json):
        with open(log_json) as handle:
            records = [json.loads(line) for line in handle if '"loss"' in line]
        if records:
            result.update(summarize(records, peak_tflops))
    if status != 0:
        result["error"] = output[-1500:]
    return result


def dry_run(name: str, flags: list[str], *, work: str, timeout_s: float, memory_gb: float):
    out = os.path.join(work, f"{name}.dry.json")
    cmd = [sys.executable, "pretrain_gpt.py", *flags, "--train-iters", "4", "--dry-run",
           "--dry-run-world-size", "1", "--memory-gb", f"{memory_gb:g}", "--dry-run-json", out]
    status, output = _run(cmd, timeout_s, os.path.join(work, f"{name}.dry.log"))
    if not os.path.exists(out):
        return {"exit": status, "error": output[-800:]}
    with open(out) as handle:
        reports = json.load(handle)
    report = reports["job"]  # odc_pp.training.dry_run.REPORT_KEY
    return {"predicted_peak_gb": report["total_gb"], "categories_gb": report["categories_gb"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results",
                                                      "gpu_step.json"))
    parser.add_argument("--iters", type=int, default=6, help="iterations of each run")
    parser.add_argument("--run", action="append", help="only these runs (repeatable; "
                        "full-1f1b, full-zbv, lbmini-packed, unpacked, hf, or a VARIANTS "
                        "name such as unpacked-expandable)")
    parser.add_argument("--tiny", action="store_true", help="small shape (CPU self-test)")
    parser.add_argument("--budget-s", type=float, default=420.0, help="cap on the whole call")
    parser.add_argument("--no-dry-run", action="store_true")
    parser.add_argument("--work", default=None, help="logs and data (default: a temp dir)")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.budget_s
    shape = TINY if args.tiny else SHAPE
    work = args.work or tempfile.mkdtemp(prefix="gpu_step_")
    os.makedirs(work, exist_ok=True)
    device, peak, memory_gb = _device()
    rows = os.path.join(work, "rows.jsonl")
    write_rows(rows, shape, shape["global_batch_size"] * (args.iters + 2))
    table = runs(shape, rows, bf16=device != "cpu")
    wanted = args.run or ["full-1f1b", "hf", *list(table)[1:]]
    result = {"device": device, "shape": shape, "iterations": args.iters,
              "peak_tflops": peak,
              "targets": {key: bound for key, (_, bound, _) in TARGETS.items()}, "runs": {}, "work": work}
    for name in wanted:
        left = deadline - time.monotonic()
        if left < 20:
            result["runs"][name] = {"not_run": "no time left in --budget-s"}
            continue
        print(f"[bench_gpu_step] {name} ({left:.0f} s left)", flush=True)
        if name == "hf":
            result["runs"][name] = hf_run(shape, rows, iters=args.iters, work=work,
                                          timeout_s=left - 5, peak_tflops=peak)
        else:
            profile = name.endswith("-profile")
            base, env, extra = VARIANTS.get(name.removesuffix("-profile"),
                                            (name.removesuffix("-profile"), None, []))
            flags = model_flags(shape) + table[base] + extra
            row = odc_run(name, flags, iters=args.iters, work=work, timeout_s=left - 5,
                          peak_tflops=peak, env=env, profile=profile)
            if not args.no_dry_run and name in ("full-1f1b", "full-zbv", "lbmini-packed") and \
                    deadline - time.monotonic() > 30:
                row["dry_run"] = dry_run(name, flags, work=work, memory_gb=memory_gb,
                                         timeout_s=min(120, deadline - time.monotonic() - 5))
            result["runs"][name] = row
        print(f"[bench_gpu_step]   {json.dumps(_brief(result['runs'][name]))}", flush=True)
        result["verdicts"] = verdicts(result["runs"])
        _write(args.out, result)
    os.remove(rows)  # data, not a log
    return 0 if all(r.get("exit", 0) == 0 for r in result["runs"].values()) else 1


def _brief(row: dict) -> dict:
    keys = ("exit", "step_s", "tokens_per_s", "mfu", "first_over_steady", "peak_allocated_gb",
            "peak_reserved_gb", "dry_run", "not_run")
    return {k: row[k] for k in keys if k in row}


def _write(path: str, result: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(result, handle, indent=1)
    os.replace(tmp, path)


def _device() -> tuple[str, float | None, float]:
    import torch
    if not torch.cuda.is_available():
        return "cpu", None, 24.0
    name = torch.cuda.get_device_name(0)
    peak = next((v for k, v in PEAK_TFLOPS.items() if k in name.upper()), None)
    return name, peak, torch.cuda.get_device_properties(0).total_memory / 2 ** 30


def hf_run(shape: dict, rows_path: str, *, iters: int, work: str, timeout_s: float,
           peak_tflops: float | None) -> dict:
    out = os.path.join(work, "hf.json")
    cmd = [sys.executable, os.path.abspath(__file__), "--hf-worker", json.dumps(shape),
           rows_path, str(iters), out]
    status, output = _run(cmd, timeout_s, os.path.join(work, "hf.log"))
    if status != 0 or not os.path.exists(out):
        return {"exit": status, "error": output[-1500:]}
    with open(out) as handle:
        row = json.load(handle)
    if peak_tflops:
        row["mfu"] = row["tflops_per_device"] / peak_tflops
    return row


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "--hf-worker":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gpu_step_hf import hf_worker
    sys.exit(hf_worker(json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]))
elif __name__ == "__main__":
    sys.exit(main())
