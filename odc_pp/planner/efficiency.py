"""How the per-GPU-kind compute efficiency of :data:`~odc_pp.planner.hardware.PRESETS`
is calibrated from measured layer and step times (issue 48, Deliver 4), instead of one
constant for every kind.

The planner times a microbatch's pass as the FLOPs it executes
(:func:`~odc_pp.schedule.costs.transformer_layer_flops` with ``causal=True``: causal
attention at half of Megatron-LM's formula, whose FLOPs stay the MFU numerator) over
:meth:`~odc_pp.planner.hardware.Hardware.flops_per_s`: ``peak x mfu x t / (t + t_half)``
for ``t`` tokens per microbatch. Two kinds of measurement fix ``mfu`` and ``t_half``:

* **A100** -- the zero-bubble paper's Table 9 (arXiv 2401.10241): the profiled F, B and
  W milliseconds of a middle pipeline stage (``ceil(L / pp)`` layers) for four GPT-3-like
  models (Table 3: h 2304 / 4096 / 5120 / 6144, FFN 4h, sequence 1024, microbatch size 6 /
  3 / 1 / 1, i.e. 6144 / 3072 / 1024 / 1024 tokens), twelve rows, bf16/fp16 on A100-SXM4
  80GB (312 TFLOP/s). Each row gives the fraction of peak a layer's F + B + W reaches
  (:func:`layer_fraction`, of the executed FLOPs): 0.51 at h 2304, 0.61-0.64 at
  h >= 4096, the same at 1024 tokens as at 3072. :func:`fit_curve` fits ``mfu`` and
  ``t_half`` to them (least squares of the relative error): ``t_half`` = 0, i.e. no
  measurable loss down to 1024 tokens (the old curve's 1024 halved it there: the data
  contradict it by 2x), and ``mfu`` = 0.585 (the 1.5B rows, small GEMMs at h 2304, are
  13% slower than that: the curve has no hidden-size term).
* **H100, H200** -- this project's GPU-step records (``benchmarks/results/
  gpu_step_h100.json``, ``gpu_step_h200.json``, run ``full-1f1b``): a 4-layer
  Llama-3-8B-shaped model (GQA, SwiGLU, vocabulary 128256 untied), 8 microbatches of
  8192 tokens, pp = dp = tp = 1. One shape per kind, so ``t_half`` is the A100's, and
  ``mfu`` is the value for which the planner predicts the measured step
  (:func:`solve_mfu`: the step is affine in ``1 / mfu``, the optimizer and gradient
  streams being memory-bound). The H200 record's profile (matmul 753 ms, attention 134,
  elementwise 252 of 1245 per step) shows where the rest of the time goes.

``tests/unit/planner/test_efficiency_calibration.py`` recomputes all three from the data
files and fails when the presets drift from them.
"""

from __future__ import annotations

from typing import Callable, Sequence

__all__ = ["layer_fraction", "fit_curve", "solve_mfu", "HALF_GRID_TOKENS"]

HALF_GRID_TOKENS = 8
"""Resolution of :func:`fit_curve`'s search over ``t_half`` (tokens)."""


def layer_fraction(flops: float, seconds: float, peak_tflops: float) -> float:
    """The fraction of peak reached by ``flops`` done in ``seconds``."""
    if not (flops > 0 and seconds > 0 and peak_tflops > 0):
        raise ValueError(f"need positive FLOPs, seconds and peak, got {flops}, {seconds}, "
                         f"{peak_tflops}")
    return flops / seconds / (peak_tflops * 1e12)


def fit_curve(points: Sequence[tuple[float, float]], *,
              max_half: float = 4096.0) -> tuple[float, float]:
    """(mfu, t_half) of ``fraction = mfu x t / (t + t_half)`` fitted to ``points`` (tokens
    per microbatch, measured fraction of peak): ``t_half`` on a grid of
    :data:`HALF_GRID_TOKENS` from 0 to ``max_half``, ``mfu`` by least squares of the
    relative error at each (closed form), the smallest total error kept (ties: the
    smallest ``t_half``)."""
    if not points or any(t <= 0 or f <= 0 for t, f in points):
        raise ValueError(f"need (tokens > 0, fraction > 0) points, got {list(points)}")
    best = None
    for step in range(int(max_half // HALF_GRID_TOKENS) + 1):
        half = step * HALF_GRID_TOKENS
        shape = [t / (t + half) / f for t, f in points]  # curve / measured, at mfu = 1
        mfu = sum(shape) / sum(s * s for s in shape)
        error = sum((mfu * s - 1.0) ** 2 for s in shape)
        if best is None or error < best[0] - 1e-15:
            best = (error, mfu, float(half))
    return best[1], best[2]


def solve_mfu(step_at: Callable[[float], float], measured_s: float) -> float:
    """The ``mfu`` at which ``step_at(mfu)`` (a predicted step, affine in ``1 / mfu``)
    equals ``measured_s``, from its values at mfu 1 and 0.5."""
    full, half = step_at(1.0), step_at(0.5)
    compute = half - full  # the part that scales with 1 / mfu, at mfu = 1
    rest = full - compute
    if compute <= 0 or measured_s <= rest:
        raise ValueError(f"the measured step {measured_s} s leaves no compute time beyond "
                         f"the {rest} s the prediction does not scale with mfu")
    return compute / (measured_s - rest)
