#!/usr/bin/env python3
"""Where a training step's GPU time goes (issue 29): ``pretrain_gpt.py``'s flags, one or more
steady iterations under ``torch.profiler`` (CPU + CUDA activities), summarised.

    python benchmarks/gpu_step_profile.py --out step_profile.json --start 3 --stop 4 -- \\
        <pretrain_gpt.py flags without --train-iters>

The iterations ``[start, stop)`` are profiled (the hook starts the profiler before
iteration ``start`` and stops it before ``stop``; ``--train-iters``, when not given, is
``stop + 1``).
Summary (rank 0): the profiled window's span and the union of kernel intervals (GPU busy
time; the rest is the GPU waiting for the host), device time per kernel category (matmul,
attention, optimizer, copies, other) and the top kernels by self device time, the top host
operations by self CPU time, and the host synchronisations (``cudaStreamSynchronize``,
``cudaDeviceSynchronize``, ``cudaEventSynchronize``) with their total time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

CATEGORIES = (("matmul", r"gemm|cutlass|nvjet|sm90_xmma|cublas|splitk"),
              ("attention", r"flash|fmha|attn|cudnn"),
              ("optimizer", r"multi_tensor|adam|fused_adam"),
              ("copy", r"memcpy|memset|copy"),
              ("other", r"."))
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def category(name: str) -> str:
    return next(c for c, pattern in CATEGORIES if re.search(pattern, name, re.IGNORECASE))


def _union_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def summarize(prof, iterations: int, top: int = 40) -> dict:
    """The profile's figures (microseconds -> milliseconds per profiled iteration)."""
    from torch.autograd import DeviceType
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    intervals = [(e.time_range.start, e.time_range.end) for e in kernels]
    span = (max(b for _, b in intervals) - min(a for a, _ in intervals)) if intervals else 0.0
    per_kernel: dict[str, list[float]] = {}
    for e in kernels:
        row = per_kernel.setdefault(e.name, [0.0, 0])
        row[0] += e.time_range.end - e.time_range.start
        row[1] += 1
    by_category: dict[str, float] = {}
    for name, (us, _) in per_kernel.items():
        by_category[category(name)] = by_category.get(category(name), 0.0) + us
    host = sorted((a for a in prof.key_averages() if a.self_cpu_time_total > 0),
                  key=lambda a: -a.self_cpu_time_total)
    scale = 1e-3 / iterations
    return {
        "iterations": iterations,
        "gpu_span_ms": span * scale, "gpu_busy_ms": _union_us(intervals) * scale,
        "gpu_busy_fraction": _union_us(intervals) / span if span else None,
        "category_ms": {k: v * scale for k, v in sorted(by_category.items(),
                                                          key=lambda kv: -kv[1])},
        "top_kernels": [{"name": name[:160], "ms": us * scale, "calls": calls // iterations,
                         "category": category(name)}
                        for name, (us, calls) in sorted(per_kernel.items(),
                                                        key=lambda kv: -kv[1][0])[:top]],
        "top_host_ops": [{"name": a.key[:120], "self_cpu_ms": a.self_cpu_time_total * scale,
                          "calls": a.count // iterations} for a in host[:top]],
        "host_syncs": {a.key: {"calls": a.count // iterations,
                               "cpu_ms": a.cpu_time_total * scale}
                       for a in prof.key_averages() if a.key in SYNCS},
    }


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--start", type=int, default=3)
    parser.add_argument("--stop", type=int, default=4)
    parser.add_argument("--trace", help="also write the Chrome trace here")
    args = parser.parse_args(argv[:split])
    if args.stop <= args.start:
        parser.error("--stop must be > --start")
    import torch
    from torch.profiler import ProfilerActivity, profile

    from odc_pp.training import pretrain
    from odc_pp.training.hooks import TrainingHooks

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA]
                                           if torch.cuda.is_available() else [])

    class Profile(TrainingHooks):
        def __init__(self):
            self.prof = None

        def before_iteration(self, iteration, topo):
            if iteration == args.start:
                self.prof = profile(activities=activities)
                self.prof.__enter__()
            elif iteration == args.stop and self.prof is not None:
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                self.prof.__exit__(None, None, None)
                if int(os.environ.get("RANK", "0")) == 0:
                    _write(args.out, summarize(self.prof, args.stop - args.start))
                    if args.trace:
                        self.prof.export_chrome_trace(args.trace)
                self.prof = None

    flags = argv[split + 1:]
    if "--train-iters" not in flags:
        flags += ["--train-iters", str(args.stop + 1)]
    return pretrain(flags, hooks=Profile())


def _write(path: str, summary: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as handle:
        json.dump(summary, handle, indent=1)


if __name__ == "__main__":
    sys.exit(main())
