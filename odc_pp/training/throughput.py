"""Throughput the way torchtitan reports it: tokens/s, model TFLOP/s per device, MFU, and
peak memory.

Model FLOPs of one microbatch of ``b`` samples padded to ``s`` tokens (forward + backward,
the usual 3x forward; multiply-add = 2 FLOPs):

* matrix multiplies with weights: ``6 * b * s * P``, where ``P`` counts the weights that
  multiply activations: per layer ``4 h^2`` (qkv and projection) + ``2 h f`` (the MLP), and
  the output layer ``V h``; embeddings, norms and biases do no matmul;
* attention scores and their product with values: ``12 * L * h * b * s^2`` (no causal
  halving, as in Megatron-LM and torchtitan).

``tests/dist/training/test_throughput.py`` checks this formula against
``torch.utils.flop_counter.FlopCounterMode`` run over forward and backward of the real
megatron-core chunks.
"""

from __future__ import annotations

import resource
import sys
from dataclasses import dataclass

import torch

from odc_pp.schedule.costs import transformer_layer_flops
from odc_pp.planner.offload_tuner import PRESETS

__all__ = ["ModelShape", "flops_per_microbatch", "microbatch_flops", "default_peak_tflops",
           "peak_memory_mb"]


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


def flops_per_microbatch(shape: ModelShape, batch: int, seq: int) -> float:
    """Forward + backward model FLOPs of one ``[batch, seq]`` microbatch: every layer's
    F + B + W (:func:`odc_pp.schedule.costs.transformer_layer_flops`) and the output
    layer's ``6 b s V h``."""
    per_layer = sum(transformer_layer_flops(batch, seq, shape.hidden_size,
                                            shape.ffn_hidden_size))
    return shape.num_layers * per_layer + 6.0 * batch * seq * shape.vocab_size * \
        shape.hidden_size


def microbatch_flops(shape: ModelShape, microbatch) -> float:
    """:func:`flops_per_microbatch` of a :class:`~odc_pp.data.microbatch.Microbatch`; a
    packed one (``segment_ids``) counts each sample as its own sequence (no attention
    across samples, padding not counted)."""
    if microbatch.segment_ids is None:
        return flops_per_microbatch(shape, *microbatch.tokens.shape)
    total = 0.0
    for row in microbatch.segment_ids:
        _, counts = torch.unique_consecutive(row[row >= 0], return_counts=True)
        total += sum(flops_per_microbatch(shape, 1, int(n)) for n in counts)
    return total


def default_peak_tflops(device: torch.device) -> float | None:
    """The dense 16-bit peak of a GPU the offload tuner has a preset for
    (:data:`odc_pp.planner.offload_tuner.PRESETS`: A100, H100, H200); None on CPU or
    another device (pass --peak-tflops)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device).upper()
    for key, hardware in PRESETS.items():
        if key.upper() in name:
            return hardware.peak_tflops
    return None


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory of this process: the CUDA caching allocator's peak reservation on a
    GPU (what the device must hold), the peak resident set size on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_reserved(device) / 2 ** 20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2 ** 20 if sys.platform == "darwin" else rss / 2 ** 10
