"""Accelerator presets, the one table of them: :data:`PRESETS` (one device and its links,
what ``odc-pp tune-offload`` and the training log's MFU use) and :data:`CLUSTERS` (the
same devices, 8 per node, with the inter-node link: what ``odc-pp plan`` uses).

Dense bf16 peak from NVIDIA's datasheets; host link = PCIe x16 effective bandwidth, about
80 % of the theoretical 32 GB/s (Gen4) / 64 GB/s (Gen5); NVLink effective per direction:

* a100: A100-SXM4-80GB, 312 TFLOP/s, 80 GB, PCIe Gen4 25 GB/s, NVLink3 240 GB/s
* h100: H100-SXM5-80GB, 989 TFLOP/s, 80 GB, PCIe Gen5 50 GB/s, NVLink4 360 GB/s
* h200: H200-SXM-141GB, 989 TFLOP/s, 141 GB, PCIe Gen5 50 GB/s, NVLink4 360 GB/s
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Hardware", "PRESETS", "Cluster", "CLUSTERS"]


@dataclass(kw_only=True)
class Hardware:
    """One accelerator and its host link."""

    name: str
    """Label."""
    peak_tflops: float
    """Dense 16-bit peak TFLOP/s."""
    memory_gb: float
    """Device memory."""
    host_link_gbps: float
    """Effective device<->host bandwidth, GB/s."""
    mfu: float = 0.45
    """Fraction of peak that transformer layers reach."""
    tp_link_gbps: float | None = None
    """Effective per-direction bandwidth between the tensor-parallel ranks (NVLink),
    GB/s; None: unknown (tensor parallelism cannot be estimated)."""

    def __post_init__(self) -> None:
        numbers = (self.peak_tflops, self.memory_gb, self.host_link_gbps) + \
            ((self.tp_link_gbps,) if self.tp_link_gbps is not None else ())
        if not all(math.isfinite(n) and n > 0 for n in numbers):
            raise ValueError(f"hardware numbers must be finite and positive, got peak "
                             f"{self.peak_tflops} TFLOP/s, memory {self.memory_gb} GB, host "
                             f"link {self.host_link_gbps} GB/s")
        if not 0 < self.mfu <= 1:
            raise ValueError(f"--mfu must be in (0, 1], got {self.mfu}")


PRESETS = {
    "a100": Hardware(name="A100-SXM4-80GB", peak_tflops=312.0, memory_gb=80.0,
                     host_link_gbps=25.0, tp_link_gbps=240.0),
    "h100": Hardware(name="H100-SXM5-80GB", peak_tflops=989.0, memory_gb=80.0,
                     host_link_gbps=50.0, tp_link_gbps=360.0),
    "h200": Hardware(name="H200-SXM-141GB", peak_tflops=989.0, memory_gb=141.0,
                     host_link_gbps=50.0, tp_link_gbps=360.0),
}


@dataclass(kw_only=True, frozen=True)
class Cluster:
    """One GPU kind and how GPUs connect."""

    name: str
    """Label."""
    peak_tflops: float
    """Dense bf16 peak TFLOP/s of one GPU."""
    hbm_gb: float
    """Memory of one GPU."""
    gpus_per_node: int
    """GPUs sharing NVLink."""
    nvlink_gbps: float
    """Effective per-direction NVLink bandwidth, GB/s."""
    internode_gbps: float
    """Effective inter-node bandwidth per GPU, GB/s."""
    host_link_gbps: float
    """Effective GPU<->host bandwidth (activation offload), GB/s."""
    efficiency: float = 0.45
    """Fraction of peak a transformer layer's matmuls reach at full size (the efficiency
    curve below scales it down for small microbatches)."""
    half_efficiency_tokens: float = 1024.0
    """Tokens per microbatch at which a layer reaches half of ``efficiency`` x peak
    (efficiency(tokens) = efficiency x tokens / (tokens + half_efficiency_tokens))."""

    def __post_init__(self) -> None:
        numbers = (self.peak_tflops, self.hbm_gb, self.nvlink_gbps, self.internode_gbps,
                   self.host_link_gbps, self.half_efficiency_tokens)
        if not all(math.isfinite(n) and n > 0 for n in numbers) or self.gpus_per_node < 1:
            raise ValueError(f"cluster {self.name}: every number must be finite and > 0")
        if not 0 < self.efficiency <= 1:
            raise ValueError(f"cluster {self.name}: efficiency must be in (0, 1]")

    def flops_per_s(self, tokens: float) -> float:
        """Achieved FLOP/s of one GPU on a microbatch of ``tokens`` tokens."""
        return self.peak_tflops * 1e12 * self.efficiency * tokens / (
            tokens + self.half_efficiency_tokens)


def _preset(key: str, internode: float) -> Cluster:
    hw = PRESETS[key]
    return Cluster(name=hw.name, peak_tflops=hw.peak_tflops, hbm_gb=hw.memory_gb,
                   gpus_per_node=8, nvlink_gbps=hw.tp_link_gbps, internode_gbps=internode,
                   host_link_gbps=hw.host_link_gbps)


CLUSTERS = {
    # inter-node: one HDR (200 Gb/s) / NDR (400 Gb/s) InfiniBand NIC per GPU, ~80% effective
    "a100": _preset("a100", 20.0),
    "h100": _preset("h100", 40.0),
    "h200": _preset("h200", 40.0),
}
"""Presets (``--cluster``): 8 GPUs per node."""
