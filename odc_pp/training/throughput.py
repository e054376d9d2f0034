"""Throughput the way torchtitan reports it: tokens/s, model TFLOP/s per device, MFU, and
peak memory.

Model FLOPs of one microbatch of ``b`` samples padded to ``s`` tokens (forward + backward,
the usual 3x forward; multiply-add = 2 FLOPs):

* matrix multiplies with weights: ``6 * b * s * P``, where ``P`` counts the weights that
  multiply activations: per layer ``2 h q + 2 h k`` (query and output projections, key and
  value projections: GQA's are smaller) + ``2 h f`` (the MLP; ``3 h f`` with SwiGLU), and
  the output layer ``V h``; embeddings, norms and biases do no matmul;
* attention scores and their product with values: ``12 * L * q * b * s^2`` (no causal
  halving, as in Megatron-LM and torchtitan).

This is Megatron-LM's ``num_floating_point_operations`` (``12 B s L h^2 ((1 + g/a + s/h)
+ 1.5 f/h + V / (2 L h))`` for a SwiGLU GQA model with kv_channels = h/a).

``tests/dist/training/test_throughput.py`` checks this formula against
``torch.utils.flop_counter.FlopCounterMode`` run over forward and backward of the real
megatron-core chunks.
"""

from __future__ import annotations

import resource
import sys

import torch

from odc_pp.planner.hardware import PRESETS
from odc_pp.planner.model import ModelShape

# ModelShape is the planner's (odc_pp.planner.model), re-exported for the training code
__all__ = ["ModelShape", "flops_per_microbatch", "microbatch_flops", "default_peak_tflops",
           "peak_memory_mb", "peak_allocated_mb"]


def flops_per_microbatch(shape: ModelShape, batch: int, seq: int) -> float:
    """Forward + backward model FLOPs of one ``[batch, seq]`` microbatch: every layer's
    F + B + W (:meth:`~odc_pp.planner.model.ModelShape.layer_flops`) and the output
    layer's ``6 b s V h``."""
    per_layer = sum(shape.layer_flops(batch, seq))
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
    (:data:`odc_pp.planner.hardware.PRESETS`: A100, H100, H200); None on CPU or
    another device (pass --peak-tflops)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device).upper()
    for key, hardware in PRESETS.items():
        if key.upper() in name:
            return hardware.peak_tflops
    return None


def peak_memory_mb(device: torch.device, outside_bytes: int = 0) -> float:
    """Peak memory of this process: the CUDA caching allocator's peak reservation plus
    ``outside_bytes`` allocated around it (:func:`peak_allocated_mb`) on a GPU (what the
    device must hold), the peak resident set size on CPU."""
    if device.type == "cuda":
        return (torch.cuda.max_memory_reserved(device) + outside_bytes) / 2 ** 20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2 ** 20 if sys.platform == "darwin" else rss / 2 ** 10


def peak_allocated_mb(device: torch.device, outside_bytes: int = 0) -> float:
    """Peak memory held by tensors: ``torch.cuda.max_memory_allocated`` plus
    ``outside_bytes`` allocated around torch's allocator (the ODC transport's symmetric
    buffers: :meth:`~odc_pp.odc.transport_group.OdcGroup.device_bytes`) on a GPU (what the
    dry run predicts), the peak resident set size on CPU."""
    if device.type == "cuda":
        return (torch.cuda.max_memory_allocated(device) + outside_bytes) / 2 ** 20
    return peak_memory_mb(device)
