"""Planner inputs: the model to plan (its shape, sequence length and source flags) and
the sample-length distribution (JSONL / pre-tokenized, or a histogram). Hardware presets
are :mod:`odc_pp.planner.hardware`'s. Reading a model from an HF ``config.json`` or
Megatron flags is :mod:`odc_pp.plan_command`'s (it needs the layers above)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from .model import ModelShape

__all__ = ["ModelSpec", "load_lengths", "describe_histogram", "LONGALIGN_LIKE"]

LONGALIGN_LIKE = "512:30,1024:20,2048:15,4096:12,8192:10,16384:8,32768:5"
"""``--lengths-histogram`` bins shaped like LongAlign's SFT lengths: most samples short
and a few near the 32K maximum (the demo's part (c), the ODC paper's setting in
``benchmarks/planner_odc_paper.py``)."""


@dataclass(kw_only=True, frozen=True)
class ModelSpec(ModelShape):
    """The model to plan: its :class:`~odc_pp.planner.model.ModelShape`, the longest
    sample and the flags it came from."""

    seq_length: int
    """Longest sample (--seq-length)."""
    source_flags: tuple[str, ...] = ()
    """The model flags exactly as the user gave them (``--model-flags``, or
    ``--hf-checkpoint DIR``); printed in every configuration's flags so a plan runs the
    same model (GQA, vocabulary, norms and rope included). Empty: rebuilt from the shape."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.seq_length < 1:
            raise ValueError(f"--seq-length must be >= 1, got {self.seq_length}")

    def model_flags(self) -> list[str]:
        """The flags a configuration repeats: the source flags, or the shape's."""
        if self.source_flags:
            return list(self.source_flags)
        return self.megatron_flags() + ["--seq-length", str(self.seq_length),
                                    "--vocab-size", str(self.vocab_size)]


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
