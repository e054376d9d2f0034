#!/usr/bin/env python3
"""The step's non-matmul kernels at the Llama-3-8B layer shape, ours against Liger's
(issue 29, Deliver 4: a fused kernel is adopted only where it wins).

For each kernel, forward + backward of one microbatch (8192 tokens, h 4096, ffn 14336,
32 / 8 heads of 128, vocabulary 128256, bf16), timed with CUDA events (median of
``--iters`` after warm-up), the peak memory it adds, and each implementation's error
against an fp32 reference of the same inputs (max |difference| over max |reference|, for
the output and every input gradient):

* ``rmsnorm``: ``odc_pp.megatron.rms_norm.rms_norm`` (``F.rms_norm`` on CUDA) vs
  ``LigerRMSNormFunction`` (casting mode ``llama``);
* ``swiglu``: ``odc_pp.megatron.swiglu.swiglu`` (saves ``[gate | up]``) and its Triton
  kernels (``odc_pp.megatron.swiglu_triton``, ``ours_triton``) vs
  ``LigerSiLUMulFunction`` on the two halves (made contiguous: megatron's fc1 output is one
  ``[gate | up]`` tensor);
* ``rope``: megatron's unfused ``_apply_rotary_pos_emb_bshd`` on ``[s, b, heads, d]`` q and k,
  and the Triton kernels (``odc_pp.megatron.rope_triton``, ``ours_triton``), vs
  ``LigerRopeFunction`` (``[b, heads, s, d]``, cos/sin of the same frequencies);
* ``linear_ce``: ``odc_pp.megatron.linear_cross_entropy.linear_cross_entropy`` vs
  ``LigerFusedLinearCrossEntropyFunction`` (sum reduction) vs the unfused output layer +
  fp32 cross entropy.

Liger comes from its wheel (``python3 -m pip install --no-deps --no-index --find-links
.whl liger-kernel``; a pure-Python package of Triton kernels); without it only our rows are
measured. ``--device cpu --tiny`` runs our rows at a small shape (a self-test of the
script). Output: ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from odc_pp.testing.bench import cuda_event_ms  # noqa: E402

SHAPE = dict(tokens=8192, hidden=4096, ffn=14336, heads=32, groups=8, head_dim=128,
             vocab=128256)
TINY = dict(tokens=256, hidden=64, ffn=176, heads=4, groups=2, head_dim=16, vocab=512)


def _liger():
    try:
        from liger_kernel.ops.fused_linear_cross_entropy import (
            LigerFusedLinearCrossEntropyFunction)
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        from liger_kernel.ops.rope import LigerRopeFunction
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction
    except Exception as exc:  # noqa: BLE001 - recorded, our rows still run
        return None, f"{type(exc).__name__}: {exc}"
    return dict(rms=LigerRMSNormFunction, swiglu=LigerSiLUMulFunction, rope=LigerRopeFunction,
                flce=LigerFusedLinearCrossEntropyFunction), None


def _inputs(shape: dict, kernel: str, device, generator) -> list[torch.Tensor]:
    """fp32 leaves of one kernel's inputs (cast per implementation)."""
    def rand(*size, scale=1.0):
        return (torch.randn(*size, generator=generator) * scale).to(device)
    t, h = shape["tokens"], shape["hidden"]
    if kernel == "rmsnorm":
        return [rand(t, h), 1 + rand(h, scale=0.1)]
    if kernel == "swiglu":
        return [rand(t, 2 * shape["ffn"])]
    if kernel == "rope":
        d = shape["head_dim"]
        return [rand(t, 1, shape["heads"], d), rand(t, 1, shape["groups"], d)]
    if kernel == "linear_ce":
        return [rand(t, h), rand(shape["vocab"], h, scale=0.02)]
    raise ValueError(kernel)


def _rope_freqs(shape: dict, device) -> torch.Tensor:
    d = shape["head_dim"]
    inv = 1.0 / (500000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    angles = torch.outer(torch.arange(shape["tokens"], dtype=torch.float32), inv)
    return torch.cat([angles, angles], dim=-1).to(device)  # [s, d], megatron's layout


def implementations(shape: dict, kernel: str, liger: dict | None, device) -> dict:
    """name -> fn(*inputs) -> (outputs to backpropagate a fixed cotangent through)."""
    from odc_pp.megatron.linear_cross_entropy import linear_cross_entropy
    from odc_pp.megatron.rms_norm import rms_norm
    from odc_pp.megatron.swiglu import swiglu
    out = {}
    if kernel == "rmsnorm":
        out["ours"] = lambda x, w: (rms_norm(x, w, 1e-5),)
        if liger:
            out["liger"] = lambda x, w: (liger["rms"].apply(x, w, 1e-5, 0.0, "llama", False),)
    elif kernel == "swiglu":
        out["ours"] = lambda x: (swiglu(x),)
        if device.type == "cuda":
            from odc_pp.megatron.swiglu_triton import fused_swiglu
            out["ours_triton"] = lambda x: (fused_swiglu(x),)
        if liger:
            out["liger"] = lambda x: (liger["swiglu"].apply(*(c.contiguous() for c in
                                                              x.chunk(2, dim=-1))),)
    elif kernel == "rope":
        from megatron.core.models.common.embeddings.rope_utils import (
            _apply_rotary_pos_emb_bshd)
        freqs = _rope_freqs(shape, device)
        # megatron's rotary embedding is fp32 (cos/sin are cast to the activations' dtype)
        out["ours"] = lambda q, k: tuple(_apply_rotary_pos_emb_bshd(
            t, freqs[:, None, None, :]) for t in (q, k))
        if device.type == "cuda":  # cos/sin once per microbatch, as the model computes them
            from odc_pp.megatron.rope_triton import RotaryInAttention
            rotary = RotaryInAttention(None, freqs[:, None, None, :])
            rotary.cos_sin()
            out["ours_triton"] = rotary.apply
        if liger:
            def liger_rope(q, k):
                cos, sin = freqs.cos()[None].to(q.dtype), freqs.sin()[None].to(q.dtype)
                qb, kb = (t.permute(1, 2, 0, 3) for t in (q, k))  # [b, heads, s, d]
                qo, ko = liger["rope"].apply(qb, kb, cos, sin)
                return qo.permute(2, 0, 1, 3), ko.permute(2, 0, 1, 3)
            out["liger"] = liger_rope
    elif kernel == "linear_ce":
        labels = torch.randint(0, shape["vocab"], (shape["tokens"],),
                               generator=torch.Generator().manual_seed(1)).to(device)
        out["ours"] = lambda x, w: (linear_cross_entropy(x[:, None], w, labels[None]).sum(),)
        out["unfused"] = lambda x, w: (F.cross_entropy((x @ w.t()).float(), labels,
                                                       reduction="sum"),)
        if liger:
            out["liger"] = lambda x, w: (liger["flce"].apply(x, w, labels, None, None, -100,
                                                             0.0, 0.0, "sum")[0],)
    return out


def _run_once(fn, leaves: list[torch.Tensor], cotangents) -> list[torch.Tensor]:
    outputs = fn(*leaves)
    torch.autograd.backward(outputs, cotangents(outputs))
    return [o.detach() for o in outputs]


def _cotangents(outputs):
    generator = torch.Generator().manual_seed(2)
    return [torch.randn(o.shape, generator=generator).to(o.device, o.dtype) if o.dim()
            else torch.ones_like(o) for o in outputs]


def measure(fn, fp32_inputs, dtype, *, iters: int, reference=None) -> dict:
    """Median fwd+bwd ms (CUDA events; host clock on CPU), added peak memory, and the
    relative error of outputs and gradients against ``reference`` (fp32 results)."""
    leaves = [x.detach().to(dtype).requires_grad_() for x in fp32_inputs]
    fixed = {}

    def cotangents(outputs):
        if "c" not in fixed:
            fixed["c"] = _cotangents(outputs)
        return fixed["c"]
    cuda = leaves[0].is_cuda
    outputs = _run_once(fn, leaves, cotangents)  # warm-up (Triton compiles here)
    result = [o.float() for o in outputs] + [x.grad.float() for x in leaves]
    def run():
        for x in leaves:
            x.grad = None  # host only: no kernel inside the timed window
        _run_once(fn, leaves, cotangents)

    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        times = cuda_event_ms(run, iters)
    else:
        import time
        times = []
        for _ in range(iters):
            begin = time.perf_counter()
            run()
            times.append((time.perf_counter() - begin) * 1e3)
    row = {"ms": statistics.median(times), "ms_range": [min(times), max(times)]}
    if cuda:
        row["added_peak_mb"] = (torch.cuda.max_memory_allocated() - base) / 2 ** 20
    if reference is not None:
        row["rel_error"] = [float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
                            for a, b in zip(result, reference)]
    return row, result


def bench_kernel(shape, kernel, liger, device, dtype, iters) -> dict:
    fp32 = _inputs(shape, kernel, device, torch.Generator().manual_seed(0))
    impls = implementations(shape, kernel, liger, device)
    _, reference = measure(impls["ours"], fp32, torch.float32, iters=1)
    rows = {}
    for name, fn in impls.items():
        try:
            rows[name], _ = measure(fn, fp32, dtype, iters=iters, reference=reference)
        except Exception as exc:  # noqa: BLE001 - one implementation's failure is a result
            rows[name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if "liger" in rows and "ms" in rows["liger"] and "ms" in rows["ours"]:
        rows["liger_speedup"] = rows["ours"]["ms"] / rows["liger"]["ms"]
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results",
                                                      "gpu_kernels.json"))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--kernel", action="append",
                        choices=["rmsnorm", "swiglu", "rope", "linear_ce"])
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    shape = TINY if args.tiny else SHAPE
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    liger, why = _liger() if device.type == "cuda" else (None, "CPU: Liger is Triton-only")
    result = {"device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "dtype": str(dtype), "shape": shape,
              "liger": None if liger is None else _liger_version(), "liger_missing": why,
              "kernels": {}}
    for kernel in args.kernel or ["rmsnorm", "swiglu", "rope", "linear_ce"]:
        result["kernels"][kernel] = bench_kernel(shape, kernel, liger, device, dtype,
                                                 args.iters)
        print(f"[bench_gpu_kernels] {kernel}: {json.dumps(result['kernels'][kernel])}",
              flush=True)
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=1)
    return 0


def _liger_version() -> str:
    from importlib.metadata import version
    return version("liger-kernel")


if __name__ == "__main__":
    sys.exit(main())
