"""Accelerator presets, the one table of them (:data:`PRESETS`): one device, its links
(host, NVLink, inter-node) and 8 per node -- what ``odc-pp tune-offload --preset``,
``odc-pp plan --cluster`` and the training log's MFU use.

Dense bf16 peak from NVIDIA's datasheets; host link = PCIe x16 effective bandwidth, about
80 % of the theoretical 32 GB/s (Gen4) / 64 GB/s (Gen5); NVLink effective per direction:

* a100: A100-SXM4-80GB, 312 TFLOP/s, 80 GB, PCIe Gen4 25 GB/s, NVLink3 240 GB/s
* h100: H100-SXM5-80GB, 989 TFLOP/s, 80 GB, PCIe Gen5 50 GB/s, NVLink4 360 GB/s
* h200: H200-SXM-141GB, 989 TFLOP/s, 141 GB, PCIe Gen5 50 GB/s, NVLink4 360 GB/s
HBM bandwidth (datasheets): A100 2,039 GB/s, H100 SXM 3,350 GB/s, H200 4,800 GB/s.

Inter-node: one HDR (200 Gb/s, A100) / NDR (400 Gb/s, H100/H200) InfiniBand NIC per GPU,
about 80 % effective: 20 / 40 GB/s.

Tensor-parallel collectives (:meth:`Hardware.tp_collective_seconds`, the alpha-beta model
of a ring all-gather / reduce-scatter over NVLink: ``(tp-1) alpha + (tp-1)/tp bytes /
busbw``), from nccl-tests measurements (``busbw``, the per-rank wire bandwidth that
``(n-1)/n`` of the tensor crosses; ``alpha``, one ring step's latency):

* NVLink4 (H100/H200), busbw 360 GB/s: sjeaugey (NCCL), NVIDIA/nccl-tests#212 -- with
  NCCL's ~20 % protocol overhead the 450 GB/s line rate gives about 370 GB/s busbw for
  non-allreduce collectives or ``NCCL_ALGO=RING``; NVIDIA/nccl-tests#326 -- 8 x H100
  ``all_gather_perf`` saturating at ~360 GB/s for 128 MB-16 GB, "exactly what we'd
  expect on H100". alpha 0.9 us: an 8-rank NVLink4 (H20) ``all_reduce_perf`` of 4-4096
  bytes takes 12.5-16.7 us (deepseek-ai/DeepEP#303), 12.5 us over its 14 ring steps.
* NVLink3 (A100), busbw 240 GB/s: the same ~20 % overhead on the 300 GB/s line rate; 8 x
  A100 boards outside a DGX measure 200-208 GB/s (NVIDIA/nccl-tests#149, #178). alpha 5 us:
  a 2-rank A100-SXM4 ``all_reduce_perf`` of 32 B takes 10.1 us (NVIDIA/nccl#583) over its
  2 ring steps (an upper bound: the kernel launch is in it).

At the planner's message sizes (one ``[s, b, h]`` bf16 activation: 8-270 MB for h 4096-8192
at 1K-16K tokens) the bandwidth term dominates: nccl-tests reach their plateau busbw from
about 32 MB.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from odc_pp.schedule.costs import ring_collective_seconds

__all__ = ["GB", "Hardware", "PRESETS", "DEFAULT_PRESET", "USABLE_MEMORY_FRACTION",
           "memory_budget_gb", "OPTIMIZER_BYTES_PER_PARAM", "STREAM_EFFICIENCY",
           "EMBEDDING_GRAD_BYTES", "OUTPUT_GRAD_BYTES"]

GB = 1e9
"""Bytes in a GB (decimal, as HBM sizes are quoted): every memory figure of the project
is printed in these."""

OPTIMIZER_BYTES_PER_PARAM = 28
"""Bytes a fused AdamW step moves per owned parameter: it reads the fp32 gradient,
master weight and two moments (16) and writes the master weight and moments (12)."""
EMBEDDING_GRAD_BYTES = 12
"""Bytes a microbatch's embedding backward moves per embedding element: its dense bf16
gradient written (2), read back (2) and added into the fp32 ``main_grad`` (4 read, 4
written) -- megatron's embedding backs into a dense ``[V, h]`` tensor."""
OUTPUT_GRAD_BYTES = 10
"""Bytes the output layer's weight gradient moves per element and microbatch beyond its
GEMM: the bf16 product read (2) and added into the fp32 ``main_grad`` (4 read, 4
written)."""
STREAM_EFFICIENCY = 0.59
"""Fraction of the datasheet HBM bandwidth the optimizer's multi-tensor kernels reach.
Calibrated on one measurement: H200, 1.92e9 owned parameters at dp=1, 19.05 ms of
``multi_tensor_apply`` kernels per step (benchmarks/results/gpu_step_h200.json,
``earlier_runs.full-1f1b-profile-run6``), i.e. 28 x 1.92e9 B / 19.05 ms = 2.82 TB/s of
4.8."""


@dataclass(kw_only=True, frozen=True)
class Hardware:
    """One accelerator, its links and how many share a node."""

    name: str
    """Label."""
    peak_tflops: float
    """Dense 16-bit peak TFLOP/s."""
    memory_gb: float
    """Device memory."""
    host_link_gbps: float
    """Effective device<->host bandwidth, GB/s."""
    mfu: float = 0.45
    """Fraction of peak that transformer layers reach (at full size: see
    :meth:`flops_per_s` for the planner's curve over microbatch sizes); the presets' are
    calibrated per kind (:mod:`odc_pp.planner.efficiency`)."""
    tp_link_gbps: float | None = None
    """Bus bandwidth of a collective between the tensor-parallel ranks (NVLink; nccl-tests'
    busbw of a ring all-gather), GB/s; None: unknown (tensor parallelism cannot be
    estimated)."""
    tp_link_latency_us: float = 0.0
    """Latency of one ring step between the tensor-parallel ranks, microseconds (the
    alpha of :meth:`tp_collective_seconds`)."""
    gpus_per_node: int = 8
    """Devices sharing NVLink."""
    internode_gbps: float | None = None
    """Effective inter-node bandwidth per device, GB/s; None: unknown (one node)."""
    half_efficiency_tokens: float = 1024.0
    """Tokens per microbatch at which a layer reaches half of ``mfu`` x peak (0: no loss
    at small microbatches; the A100 measurements show none down to 1024 tokens)."""
    memory_gbps: float | None = None
    """Device memory (HBM) bandwidth from the datasheet, GB/s; None: unknown (the
    optimizer step is left out of the predicted step)."""

    def __post_init__(self) -> None:
        numbers = (self.peak_tflops, self.memory_gb, self.host_link_gbps) + tuple(
            n for n in (self.tp_link_gbps, self.internode_gbps) if n is not None)
        if not all(math.isfinite(n) and n > 0 for n in numbers) or self.gpus_per_node < 1:
            raise ValueError(f"hardware numbers must be finite and positive, got peak "
                             f"{self.peak_tflops} TFLOP/s, memory {self.memory_gb} GB, host "
                             f"link {self.host_link_gbps} GB/s")
        if not (math.isfinite(self.tp_link_latency_us) and self.tp_link_latency_us >= 0):
            raise ValueError(f"the tensor-parallel link latency must be >= 0 us, got "
                             f"{self.tp_link_latency_us}")
        if not 0 < self.mfu <= 1:
            raise ValueError(f"--mfu must be in (0, 1], got {self.mfu}")
        if not (math.isfinite(self.half_efficiency_tokens) and self.half_efficiency_tokens >= 0):
            raise ValueError(f"half_efficiency_tokens must be finite and >= 0, got "
                             f"{self.half_efficiency_tokens}")

    def optimizer_seconds(self, owned_params: float) -> float:
        """One fused AdamW step over ``owned_params`` fp32 parameters: it streams
        :data:`OPTIMIZER_BYTES_PER_PARAM` per parameter (:meth:`stream_seconds`)."""
        return self.stream_seconds(owned_params * OPTIMIZER_BYTES_PER_PARAM)

    def stream_seconds(self, moved_bytes: float) -> float:
        """A memory-bound pass that reads and writes ``moved_bytes`` in all, at
        :data:`STREAM_EFFICIENCY` of ``memory_gbps`` (0 when the bandwidth is unknown)."""
        if self.memory_gbps is None:
            return 0.0
        return moved_bytes / (self.memory_gbps * 1e9 * STREAM_EFFICIENCY)

    def tp_collective_seconds(self, message_bytes: float, tp: int) -> float:
        """One all-gather or reduce-scatter of a ``message_bytes`` tensor over ``tp``
        tensor-parallel ranks: ``(tp-1) alpha + (tp-1)/tp bytes / busbw`` (see the module
        docstring for the numbers)."""
        if self.tp_link_gbps is None:
            return 0.0 if tp == 1 else math.inf
        return ring_collective_seconds(message_bytes, tp, link_bytes_per_s=self.tp_link_gbps
                                       * GB, latency_s=self.tp_link_latency_us * 1e-6)

    def flops_per_s(self, tokens: float) -> float:
        """Achieved FLOP/s of one device on a microbatch of ``tokens`` tokens (the
        planner's efficiency curve: ``mfu x tokens / (tokens + half_efficiency_tokens)``
        of peak)."""
        return self.peak_tflops * 1e12 * self.mfu * tokens / (
            tokens + self.half_efficiency_tokens)


PRESETS = {
    "a100": Hardware(name="A100-SXM4-80GB", peak_tflops=312.0, memory_gb=80.0,
                     host_link_gbps=25.0, tp_link_gbps=240.0, tp_link_latency_us=5.0,
                     internode_gbps=20.0, memory_gbps=2039.0, mfu=0.585,
                     half_efficiency_tokens=0.0),
    "h100": Hardware(name="H100-SXM5-80GB", peak_tflops=989.0, memory_gb=80.0,
                     host_link_gbps=50.0, tp_link_gbps=360.0, tp_link_latency_us=0.9,
                     internode_gbps=40.0, memory_gbps=3350.0, mfu=0.476,
                     half_efficiency_tokens=0.0),
    "h200": Hardware(name="H200-SXM-141GB", peak_tflops=989.0, memory_gb=141.0,
                     host_link_gbps=50.0, tp_link_gbps=360.0, tp_link_latency_us=0.9,
                     internode_gbps=40.0, memory_gbps=4800.0, mfu=0.541,
                     half_efficiency_tokens=0.0),
}
"""Presets (``--preset`` / ``--cluster``). ``mfu`` and ``half_efficiency_tokens`` per kind
are calibrated from measured layer and step times (:mod:`odc_pp.planner.efficiency`: the
zero-bubble paper's Table 9 on A100, this project's GPU-step records on H100 and H200)."""

DEFAULT_PRESET = "h100"
"""The GPU kind ``odc-pp plan --cluster`` and the dry run's ``--dry-run-gpu`` assume."""

USABLE_MEMORY_FRACTION = 0.9
"""Share of a GPU's HBM a job may plan to fill: the rest is the CUDA context, NCCL's
buffers and the caching allocator's fragmentation, which no memory model counts."""


def memory_budget_gb(gpu: Hardware, memory_gb: float | None = None) -> float:
    """The one memory verdict's budget per GPU, in GB: ``memory_gb`` (``--memory-gb``)
    when given, else :data:`USABLE_MEMORY_FRACTION` of ``gpu``'s HBM (``odc-pp plan
    --cluster``, the dry run's ``--dry-run-gpu``: a :data:`PRESETS` entry)."""
    if memory_gb is None:
        return USABLE_MEMORY_FRACTION * gpu.memory_gb
    if not (math.isfinite(memory_gb) and memory_gb > 0):
        raise ValueError(f"--memory-gb must be > 0, got {memory_gb}")
    return float(memory_gb)
