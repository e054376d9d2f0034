"""Planner inputs: cluster presets, the model shape and the sample-length distribution
(JSONL / pre-tokenized, or a histogram). Reading a model from an HF ``config.json`` or
Megatron flags is :mod:`odc_pp.plan_command`'s (it needs the layers above)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np

from .offload_tuner import PRESETS

__all__ = ["Cluster", "CLUSTERS", "ModelSpec", "load_lengths", "describe_histogram"]


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
    hw = PRESETS[key]  # tune-offload's presets: peak, HBM, host link, NVLink
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


@dataclass(kw_only=True, frozen=True)
class ModelSpec:
    """The transformer's shape as the planner needs it."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    """MLP width (SwiGLU: the intermediate size; its three matmuls are counted)."""
    vocab_size: int
    seq_length: int
    """Longest sample (--seq-length)."""
    swiglu: bool = False
    """Gated MLP (three h x ffn matmuls instead of two)."""
    source_flags: tuple[str, ...] = ()
    """The model flags exactly as the user gave them (``--model-flags``, or
    ``--hf-checkpoint DIR``); printed in every configuration's flags so a plan runs the
    same model (GQA, vocabulary, norms and rope included). Empty: rebuilt from the shape."""

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size",
                     "vocab_size", "seq_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"model {name} must be >= 1")

    @property
    def flops_ffn(self) -> int:
        """The MLP width of an equivalent two-matmul MLP (FLOPs formula input)."""
        return self.ffn_hidden_size * 3 // 2 if self.swiglu else self.ffn_hidden_size

    @property
    def params(self) -> float:
        h = self.hidden_size
        per_layer = 4 * h * h + (3 if self.swiglu else 2) * h * self.ffn_hidden_size + 4 * h
        return self.num_layers * per_layer + 2 * self.vocab_size * h

    def model_flags(self) -> list[str]:
        if self.source_flags:
            return list(self.source_flags)
        flags = ["--num-layers", str(self.num_layers), "--hidden-size", str(self.hidden_size),
                 "--num-attention-heads", str(self.num_attention_heads),
                 "--ffn-hidden-size", str(self.ffn_hidden_size),
                 "--seq-length", str(self.seq_length), "--vocab-size", str(self.vocab_size)]
        return flags + (["--swiglu"] if self.swiglu else [])


def _length_of(record: dict, path: str, line: int) -> int:
    for key in ("input_ids", "tokens"):
        if isinstance(record.get(key), list):
            return len(record[key])
    for key in ("length", "num_tokens", "len"):
        if key in record:
            return int(record[key])
    raise ValueError(f"{path}:{line}: a record needs input_ids/tokens (a list) or "
                     f"length/num_tokens")


def describe_histogram(histogram: str, lengths: np.ndarray) -> str:
    """How ``--lengths-histogram`` was read, for the plan's output."""
    bins = sorted((int(a), float(b)) for a, b in (p.split(":") for p in histogram.split(",")))
    spans, low = [], 1
    for length, weight in bins:
        spans.append(f"{weight:g} in {low}..{length}")
        low = length + 1
    return (f"lengths: --lengths-histogram LEN:WEIGHT bins, each bin's samples uniform from "
            f"the previous bin's length + 1 to its own ({', '.join(spans)}); {len(lengths)} "
            f"draws: mean {lengths.mean():.0f}, median {np.median(lengths):.0f}, max "
            f"{lengths.max()} tokens")


def load_lengths(*, jsonl: str | None = None, histogram: str | None = None,
                 seq_length: int, count: int = 4096, seed: int = 0) -> np.ndarray:
    """Sample lengths (truncated to ``seq_length``): every record of a JSONL file
    (pre-tokenized ``input_ids`` or a ``length`` field), or ``count`` draws (fixed
    ``seed``) from a histogram ``"LEN:WEIGHT,LEN:WEIGHT,..."`` (each bin's samples
    uniform between the previous bin's length and its own)."""
    if (jsonl is None) == (histogram is None):
        raise ValueError("give exactly one of --lengths-jsonl and --lengths-histogram")
    if jsonl is not None:
        lengths = []
        with open(jsonl, encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if line.strip():
                    lengths.append(_length_of(json.loads(line), jsonl, number))
        if not lengths:
            raise ValueError(f"--lengths-jsonl {jsonl}: no records")
        return np.clip(np.asarray(lengths, dtype=np.int64), 1, seq_length)
    try:
        bins = [(int(a), float(b)) for a, b in (part.split(":") for part in histogram.split(","))]
    except ValueError as exc:
        raise ValueError(f"--lengths-histogram {histogram!r}: expected LEN:WEIGHT,...") from exc
    bins.sort()
    if any(length < 1 or weight < 0 for length, weight in bins) or \
            sum(w for _, w in bins) <= 0:
        raise ValueError(f"--lengths-histogram {histogram!r}: lengths >= 1, weights >= 0")
    rng = np.random.default_rng(seed)
    weights = np.asarray([w for _, w in bins]) / sum(w for _, w in bins)
    which = rng.choice(len(bins), size=count, p=weights)
    lows = np.asarray([1] + [b[0] + 1 for b in bins[:-1]])
    highs = np.asarray([b[0] for b in bins])
    lengths = rng.integers(lows[which], np.maximum(highs[which], lows[which]) + 1)
    return np.clip(lengths, 1, seq_length).astype(np.int64)
