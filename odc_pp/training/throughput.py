"""Throughput the way torchtitan reports it: tokens/s, model TFLOP/s per device, MFU, and
peak memory.

Model FLOPs of one microbatch of ``b`` samples padded to ``s`` tokens (forward + backward,
the usual 3x forward; multiply-add = 2 FLOPs):

* matrix multiplies with weights: ``6 * b * s * P``, where ``P`` counts the weights that
  multiply activations: per layer ``4 h^2`` (qkv and projection) + ``2 h f`` (the MLP), and
  the output layer ``V h``; embeddings, norms and biases do no matmul;
* attention scores and their product with values: ``12 * L * h * b * s^2`` (no causal
  halving, as in Megatron-LM and torchtitan).

``tests/training/test_throughput.py`` checks this formula against
``torch.utils.flop_counter.FlopCounterMode`` run over forward and backward of the real
megatron-core chunks.
"""

from __future__ import annotations

import resource
import sys
from dataclasses import dataclass

import torch

__all__ = ["ModelShape", "flops_per_microbatch", "default_peak_tflops", "peak_memory_mb",
           "PEAK_TFLOPS"]

PEAK_TFLOPS: dict[str, float] = {
    # Dense bf16 tensor-core peaks from the vendors' data sheets (SXM parts).
    "H200": 989.0,
    "H100": 989.0,
    "A100": 312.0,
    "L40S": 362.0,
    "A10G": 70.0,
}


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """What the FLOPs formula needs of a GPT."""

    num_layers: int
    """Transformer layers."""
    hidden_size: int
    """Hidden size h."""
    ffn_hidden_size: int
    """MLP hidden size f."""
    vocab_size: int
    """Padded vocabulary V (the output layer's rows)."""

    @property
    def matmul_params(self) -> int:
        """Weights that multiply activations (per-token FLOPs are 6x this)."""
        h, f = self.hidden_size, self.ffn_hidden_size
        return self.num_layers * (4 * h * h + 2 * h * f) + self.vocab_size * h


def flops_per_microbatch(shape: ModelShape, batch: int, seq: int) -> float:
    """Forward + backward model FLOPs of one ``[batch, seq]`` microbatch."""
    tokens = batch * seq
    attention = 12 * shape.num_layers * shape.hidden_size * batch * seq * seq
    return 6.0 * tokens * shape.matmul_params + float(attention)


def default_peak_tflops(device: torch.device) -> float | None:
    """The dense bf16 peak of a known GPU; None on CPU or an unknown device."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device).upper()
    for key, value in PEAK_TFLOPS.items():
        if key in name:
            return value
    return None


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory of this process: the CUDA caching allocator's peak reservation on a
    GPU (what the device must hold), the peak resident set size on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_reserved(device) / 2 ** 20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2 ** 20 if sys.platform == "darwin" else rss / 2 ** 10
