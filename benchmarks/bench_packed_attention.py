"""Packed-sequence attention on a GPU: each kernel of odc_pp.megatron.packed_attention against
the pre-issue-21 path (K/V expanded with repeat_interleave, SDPA with a dense s x s mask).

Parity (``--parity-seq`` tokens, one packed row of seeded random documents and a padding
tail, GQA): output and the q/k/v gradients of every kernel, in bf16 (and flex in fp32),
against the old path computed in fp32 by SDPA's math backend; a bf16 kernel passes when
its error (max |x - ref| / max |ref|) is at most ``2 x`` the old path's own bf16 error
plus 1e-3; fp32 flex at most 1e-3.

Timing (``--seq`` tokens, Llama-3-8B attention shape by default: 32 heads, 8 K/V groups,
head dim 128, bf16): forward + backward of one layer's core attention per kernel, median
of ``--repeats`` timed with CUDA events after ``--warmup`` calls (flex compiles during
warm-up); the segments' metadata and masks are built before (once per microbatch in
training, shared by every layer).

    python benchmarks/bench_packed_attention.py [--json] [--out FILE] [--kernels varlen flex]

Needs CUDA; imports torch and odc_pp.megatron.packed_attention only (no megatron-core, no
built extension). Exit status 0 when every parity check passed, 1 otherwise, 2 without
CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from odc_pp.megatron.packed_attention import (PackedSegments, packed_attention,  # noqa: E402
                                              packed_causal_mask, resolve_kernel,
                                              varlen_backend)
from odc_pp.megatron.varlen_gqa import gqa_flash_problem  # noqa: E402

KERNELS = ("varlen", "flex", "dense")


def old_path(q, k, v, segment_ids, scale):
    """SdpaDotProductAttention before issue 21 for packed rows."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=~packed_causal_mask(segment_ids), scale=scale)


def packed_segments(seq: int, *, seed: int, pad: int) -> torch.Tensor:
    """[1, seq] segment ids: seeded document lengths (16 .. seq / 4) then ``pad`` padding."""
    generator = torch.Generator().manual_seed(seed)
    ids, used, doc = [], 0, 0
    while used < seq - pad:
        length = min(int(torch.randint(16, max(17, seq // 4), (1,), generator=generator)),
                     seq - pad - used)
        ids += [doc] * length
        used, doc = used + length, doc + 1
    return torch.tensor([ids + [-1] * pad])


def _inputs(seq, heads, groups, dim, dtype, device, seed):
    generator = torch.Generator(device="cpu").manual_seed(seed)
    shapes = [(1, heads, seq, dim), (1, groups, seq, dim), (1, groups, seq, dim)]
    tensors = [torch.randn(shape, generator=generator) for shape in shapes]
    grad = torch.randn(shapes[0], generator=generator)
    return [t.to(device, dtype) for t in tensors], grad.to(device, dtype)


def _forward_backward(fn, tensors, grad):
    leaves = [t.detach().clone().requires_grad_(True) for t in tensors]
    out = fn(*leaves)
    out.backward(grad)
    return [out.detach().float()] + [leaf.grad.float() for leaf in leaves]


def _error(got, ref):
    return max(float((g - r).abs().max() / r.abs().max()) for g, r in zip(got, ref))


def parity(args, device) -> list[dict]:
    segment_ids = packed_segments(args.parity_seq, seed=args.seed, pad=37)
    scale = args.dim ** -0.5
    fp32, grad32 = _inputs(args.parity_seq, args.parity_heads, args.parity_groups, args.dim,
                           torch.float32, device, args.seed)
    ids = segment_ids.to(device)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        reference = _forward_backward(lambda q, k, v: old_path(q, k, v, ids, scale), fp32,
                                      grad32)
    bf16 = [t.to(torch.bfloat16) for t in fp32]
    old_error = _error(_forward_backward(lambda q, k, v: old_path(q, k, v, ids, scale), bf16,
                                         grad32.to(torch.bfloat16)), reference)
    rows = [{"kernel": "old-dense", "dtype": "bfloat16", "error": old_error, "passed": True}]
    cases = [(kernel, torch.bfloat16) for kernel in args.kernels]
    if "flex" in args.kernels and args.fp32_flex:
        cases.append(("flex", torch.float32))
    for kernel, dtype in cases:
        segments = PackedSegments(segment_ids, device)
        tensors = [t.to(dtype) for t in fp32]
        try:
            got = _forward_backward(
                lambda q, k, v: packed_attention(q, k, v, segments, scale=scale, kernel=kernel),
                tensors, grad32.to(dtype))
        except Exception as error:  # recorded, not raised: the other kernels still run
            rows.append({"kernel": kernel, "dtype": str(dtype).removeprefix("torch."),
                         "error": None, "passed": False, "failure": repr(error)[:300]})
            continue
        error = _error(got, reference)
        bound = 2 * old_error + 1e-3 if dtype is torch.bfloat16 else 1e-3
        rows.append({"kernel": kernel, "dtype": str(dtype).removeprefix("torch."),
                     "error": error, "bound": bound, "passed": error <= bound})
    return rows


def timing(args, device) -> list[dict]:
    segment_ids = packed_segments(args.seq, seed=args.seed + 1, pad=0)
    ids = segment_ids.to(device)
    scale = args.dim ** -0.5
    tensors, grad = _inputs(args.seq, args.heads, args.groups, args.dim, torch.bfloat16,
                            device, args.seed)
    calls = {"old-dense": lambda q, k, v: old_path(q, k, v, ids, scale)}
    for kernel in args.kernels:
        # built once per microbatch and shared by every layer in training: outside the timing
        segments = PackedSegments(segment_ids, device)
        calls[kernel] = (lambda kernel, segments: lambda q, k, v: packed_attention(
            q, k, v, segments, scale=scale, kernel=kernel))(kernel, segments)
    rows = []
    for name, fn in calls.items():
        try:
            for _ in range(args.warmup):
                _forward_backward(fn, tensors, grad)
            times = []
            for _ in range(args.repeats):
                start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                leaves = [t.detach().clone().requires_grad_(True) for t in tensors]
                torch.cuda.synchronize()
                start.record()
                fn(*leaves).backward(grad)
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
            rows.append({"kernel": name, "fwd_bwd_ms": statistics.median(times),
                         "peak_mib": torch.cuda.max_memory_allocated() / 2**20})
        except Exception as error:
            rows.append({"kernel": name, "fwd_bwd_ms": None, "failure": repr(error)[:300]})
        torch.cuda.reset_peak_memory_stats()
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", nargs="+", choices=KERNELS, default=list(KERNELS))
    parser.add_argument("--parity-seq", type=int, default=2048)
    parser.add_argument("--parity-heads", type=int, default=8)
    parser.add_argument("--parity-groups", type=int, default=2)
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-fp32-flex", dest="fp32_flex", action="store_false",
                        help="skip the fp32 flex parity case (one compile fewer)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--out", help="also write the JSON result to this file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_packed_attention: needs a CUDA device", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    backend = varlen_backend(args.groups if args.heads != args.groups else 1)
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "varlen_backend": backend[0] if backend else None,
              "gqa_flash_problem": gqa_flash_problem(str(device)),
              "auto_kernel_bf16": resolve_kernel("auto", device=device, dtype=torch.bfloat16,
                                                 dropout=0.0),
              "auto_kernel_fp32": resolve_kernel("auto", device=device, dtype=torch.float32,
                                                 dropout=0.0)}
    if "varlen" in args.kernels and backend is None:
        args.kernels = [k for k in args.kernels if k != "varlen"]
        result["varlen_skipped"] = "neither torch.nn.attention.varlen nor flash_attn"
    result["parity"] = parity(args, device)
    result["timing"] = timing(args, device)
    result["passed"] = all(row["passed"] for row in result["parity"])
    text = json.dumps(result, indent=2)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as handle:
            handle.write(text + "\n")
    if args.json:
        print(text)
    else:
        for row in result["parity"]:
            print(f"parity {row['kernel']:10s} {row['dtype']:9s} error {row['error']} "
                  f"{'ok' if row['passed'] else 'FAIL'} {row.get('failure', '')}")
        for row in result["timing"]:
            print(f"timing {row['kernel']:10s} fwd+bwd {row['fwd_bwd_ms']} ms "
                  f"{row.get('failure', '')}")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
