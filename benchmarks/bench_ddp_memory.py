#!/usr/bin/env python3
"""Where ODC's gain over Megatron's ``ddp`` is memory: the largest Llama-like model that
fits an 80 GB GPU at dp = 8 under ``--dp-mode odc`` and under ``--dp-mode ddp``.

For each model (Llama-3-8B, a 14B and a 32B of Qwen2.5's shape, Llama-3-70B) and each
fixed tensor/pipeline layout, the peak of every pipeline rank is computed by the dry run's
memory model (:func:`odc_pp.training.plan_memory.rank_peaks`: the same formulas the dry
run checks on fake tensors) for both data-parallel modes, everything else equal: bf16,
sequence 4096, micro-batch 1, ``--load-balance balanced`` (``ddp`` refuses ``lb-mini`` at
dp > 1), 1F1B, untied embeddings. ``odc`` shards parameters, gradients and optimizer
state over dp and gathers a chunk's parameters for the minibatch; ``ddp`` keeps the
parameters replicated and a full fp32 gradient buffer (Megatron's DDP with the
distributed optimizer: only the optimizer state is sharded).

    python benchmarks/bench_ddp_memory.py --json --out benchmarks/results/ddp_memory.json
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from odc_pp.testing.bench import emit  # noqa: E402
from odc_pp.training.plan_memory import rank_peaks  # noqa: E402

MODELS = {
    "8B (Llama-3)": "--num-layers 32 --hidden-size 4096 --num-attention-heads 32 "
                    "--num-query-groups 8 --ffn-hidden-size 14336 --vocab-size 128256",
    "14B (Qwen2.5 shape)": "--num-layers 48 --hidden-size 5120 --num-attention-heads 40 "
                           "--num-query-groups 8 --ffn-hidden-size 13824 "
                           "--vocab-size 152064",
    "32B (Qwen2.5 shape)": "--num-layers 64 --hidden-size 5120 --num-attention-heads 40 "
                           "--num-query-groups 8 --ffn-hidden-size 27648 "
                           "--vocab-size 152064",
    "70B (Llama-3)": "--num-layers 80 --hidden-size 8192 --num-attention-heads 64 "
                     "--num-query-groups 8 --ffn-hidden-size 28672 --vocab-size 128256",
}
"""Model name -> its shape flags (GQA, SwiGLU, RMSNorm from ``SHARED``)."""

SHARED = ("--group-query-attention --swiglu --normalization RMSNorm "
          "--position-embedding-type rope --disable-bias-linear "
          "--untie-embeddings-and-output-weights --seq-length 4096 "
          "--max-position-embeddings 4096 --bf16 --micro-batch-size 1 "
          "--lr 1e-5 --train-iters 10 --load-balance balanced --pipeline-schedule 1f1b")
"""Flags every row shares."""

LAYOUTS = {"tp1 pp1": "", "tp2 pp1": "--tensor-model-parallel-size 2 --sequence-parallel",
           "tp4 pp1": "--tensor-model-parallel-size 4 --sequence-parallel",
           "tp4 pp2": "--tensor-model-parallel-size 4 --sequence-parallel "
                      "--pipeline-model-parallel-size 2"}
"""Layout name -> its flags; the world is tp x pp x dp."""

MODES = {"odc-minibatch": "--dp-mode odc --odc-param-residency minibatch",
         "odc-layer": "--dp-mode odc --odc-param-residency layer",
         "ddp": "--dp-mode ddp"}
"""The data-parallel modes compared: ODC with each parameter residency (``auto``, the
default, picks ``layer`` where ``minibatch`` does not fit) and Megatron's DDP."""


def row(model: str, layout: str, dp: int, gpu_gb: float) -> dict:
    """Both modes' worst pipeline rank for one model and layout."""
    flags = f"{MODELS[model]} {SHARED} {LAYOUTS[layout]}".split()
    tp = int(layout.split()[0][2:])
    pp = int(layout.split()[1][2:])
    out = {"model": model, "layout": layout, "dp": dp}
    for mode, mode_flags in MODES.items():
        gb = [p / 1e9 for p in rank_peaks(flags + mode_flags.split() + [
            "--global-batch-size", str(8 * dp)], tp * pp * dp)]
        out[f"{mode}_peak_gb"] = round(max(gb), 1)
    # --odc-param-residency auto (the default) picks layer where minibatch does not fit
    out["odc_peak_gb"] = min(out["odc-minibatch_peak_gb"], out["odc-layer_peak_gb"])
    out["odc_fits"] = out["odc_peak_gb"] <= gpu_gb
    out["ddp_fits"] = out["ddp_peak_gb"] <= gpu_gb
    return out


def largest(rows: list[dict], mode: str) -> dict:
    """Per layout: the largest model (in ``MODELS`` order) that fits under ``mode``."""
    out = {}
    for layout in LAYOUTS:
        fitting = [r["model"] for r in rows if r["layout"] == layout and r[f"{mode}_fits"]]
        out[layout] = fitting[-1] if fitting else None
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dp", type=int, default=8, help="data-parallel size")
    parser.add_argument("--gpu-gb", type=float, default=80.0, help="GPU memory (GB, 1e9)")
    parser.add_argument("--json", action="store_true", help="print the JSON document")
    parser.add_argument("--out", default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    if args.dp < 2 or args.gpu_gb <= 0:
        parser.error("--dp must be >= 2 and --gpu-gb > 0")
    started = time.perf_counter()
    rows = [row(m, layout, args.dp, args.gpu_gb) for layout in LAYOUTS for m in MODELS]
    doc = {"benchmark": "bench_ddp_memory", "doc": __doc__.split("\n\n")[1],
           "settings": {"shared_flags": SHARED, "dp": args.dp, "gpu_gb": args.gpu_gb},
           "rows": rows, "largest_fitting": {m: largest(rows, m) for m in ("odc", "ddp")},
           "wall_s": round(time.perf_counter() - started, 1)}
    emit(doc, out=args.out, as_json=args.json)
    if not args.json:
        for r in rows:
            print(f"{r['layout']:8s} {r['model']:20s} odc minibatch/layer "
                  f"{r['odc-minibatch_peak_gb']:6.1f}/{r['odc-layer_peak_gb']:6.1f} GB "
                  f"{'fits' if r['odc_fits'] else 'OOM '}  ddp {r['ddp_peak_gb']:6.1f} GB "
                  f"{'fits' if r['ddp_fits'] else 'OOM'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
