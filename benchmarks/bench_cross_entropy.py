#!/usr/bin/env python3
"""The fused output layer + cross entropy side by side at the real shape (issue 50, item 1):
ours as it is (the chunk's gradient written over its bf16 logits), ours as it was (an fp32
log-softmax per chunk), Liger Kernel's ``LigerFusedLinearCrossEntropyLoss`` and Apple's
``cut_cross_entropy.linear_cross_entropy``; a library that is not installed is recorded as
skipped.

Shape (default): Llama-3-8B's output layer, 8192 tokens x hidden 4096 x vocabulary 128256,
bf16. Each implementation runs the mean token loss forward and backward (input and weight
gradients); the row holds the median CUDA-event time over ``--iters`` (after one warm-up),
the peak memory above the inputs, the loss and the relative distance of its input and
weight gradients to ours-previous'. ``--tiny`` runs a small shape (a CPU self-test of the
script: ours only, wall-clock times).

    python3 benchmarks/bench_cross_entropy.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from odc_pp.megatron import linear_cross_entropy as lce  # noqa: E402

REAL = dict(tokens=8192, hidden=4096, vocab=128256)
TINY = dict(tokens=96, hidden=32, vocab=1000)


def _previous_chunk(x, weight, labels, want_grad):
    """The chunk code before issue 50: fp32 log-softmax (an fp32 copy of the chunk's
    logits), ``exp_`` in place, the cast back."""
    valid = labels != lce.IGNORE_INDEX
    target = labels.masked_fill(~valid, 0).unsqueeze(1)
    logp = torch.log_softmax(x @ weight.t(), dim=1,
                             dtype=torch.promote_types(x.dtype, torch.float32))
    loss = logp.gather(1, target).squeeze(1).neg_().masked_fill_(~valid, 0.0)
    if not want_grad:
        return loss, None, valid
    probs = logp.exp_()
    probs.scatter_add_(1, target, torch.full_like(target, -1, dtype=probs.dtype))
    return loss, probs.to(x.dtype), valid


def _ours(x, weight, labels):
    losses = lce.linear_cross_entropy(x.unsqueeze(1), weight, labels.unsqueeze(0))
    return losses.float().mean()


def _ours_previous(x, weight, labels):
    current = lce._chunk
    lce._chunk = _previous_chunk
    try:
        return _ours(x, weight, labels)
    finally:
        lce._chunk = current


def _liger():
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
    loss = LigerFusedLinearCrossEntropyLoss(reduction="mean")
    return lambda x, weight, labels: loss(weight, x, labels)


def _cce():
    from cut_cross_entropy import linear_cross_entropy
    return lambda x, weight, labels: linear_cross_entropy(x, weight, labels, reduction="mean")


IMPLEMENTATIONS: dict[str, Callable[[], Callable]] = {
    "ours-previous": lambda: _ours_previous, "ours": lambda: _ours,
    "liger-kernel": _liger, "cut-cross-entropy": _cce}
"""Name -> a function making the loss function ``(x [t, h], weight [V, h], labels [t])``
(ImportError: the library is not installed)."""


def _timed(fn, x, weight, labels, cuda: bool):
    x, weight = x.detach().requires_grad_(), weight.detach().requires_grad_()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    began = time.perf_counter()
    loss = fn(x, weight, labels)
    loss.backward()
    if cuda:
        end.record()
        torch.cuda.synchronize()
        return (start.elapsed_time(end), (torch.cuda.max_memory_allocated() - base) / 2 ** 20,
                float(loss), x.grad, weight.grad)
    return (time.perf_counter() - began) * 1e3, None, float(loss), x.grad, weight.grad


def _distance(got: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.double()
    return float((got.double() - ref).norm() / ref.norm().clamp_min(1e-30))


def run(shape: dict, iters: int, device: torch.device, dtype: torch.dtype) -> dict:
    """Every implementation's row at ``shape``."""
    generator = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(shape["tokens"], shape["hidden"], device=device, generator=generator,
                    dtype=dtype)
    weight = (0.02 * torch.randn(shape["vocab"], shape["hidden"], device=device,
                                 generator=generator)).to(dtype)
    labels = torch.randint(0, shape["vocab"], (shape["tokens"],), device=device,
                           generator=generator)
    cuda = device.type == "cuda"
    rows, reference = {}, None
    for name, make in IMPLEMENTATIONS.items():
        if name in ("liger-kernel", "cut-cross-entropy") and not cuda:
            rows[name] = {"skipped": "needs a CUDA device"}
            continue
        try:
            fn = make()
        except ImportError as exc:
            rows[name] = {"skipped": f"not installed ({exc})"}
            continue
        try:
            _timed(fn, x, weight, labels, cuda)  # warm-up (compiles)
            runs = [_timed(fn, x, weight, labels, cuda) for _ in range(iters)]
        except Exception as exc:  # noqa: BLE001 - one library failing leaves the others
            rows[name] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
            continue
        last = runs[-1]
        row = {"ms": statistics.median(r[0] for r in runs),
               "ms_range": [min(r[0] for r in runs), max(r[0] for r in runs)],
               "peak_mib": last[1], "loss": last[2]}
        if reference is None:
            reference = last
        else:
            row["grad_input_vs_previous"] = _distance(last[3], reference[3])
            row["grad_weight_vs_previous"] = _distance(last[4], reference[4])
            row["loss_minus_previous"] = last[2] - reference[2]
        rows[name] = row
        del runs, last
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the result to this file")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--tiny", action="store_true", help="small shape (CPU self-test)")
    for key, value in REAL.items():
        parser.add_argument(f"--{key}", type=int, default=value)
    args = parser.parse_args(argv)
    shape = TINY if args.tiny else {key: getattr(args, key) for key in REAL}
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and not args.tiny:
        print("bench_cross_entropy: the real shape needs a CUDA device (--tiny on a CPU)",
              file=sys.stderr)
        return 2
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    result = {"device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "shape": shape, "dtype": str(dtype),
              "iters": args.iters, "timing": "CUDA events" if device.type == "cuda"
              else "wall clock", "rows": run(shape, args.iters, device, dtype)}
    timed = {name: row["ms"] for name, row in result["rows"].items() if "ms" in row}
    if timed:
        result["fastest"] = min(timed, key=timed.get)
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            handle.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
