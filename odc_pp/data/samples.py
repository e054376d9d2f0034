"""Samples, microbatches and the split of a global batch into variable-length microbatches.

A sample is ``tokens`` (L + 1 ids) and ``loss_mask`` (L values for the L predicted
tokens): the model reads ``tokens[:-1]`` and is scored on ``tokens[1:]``. A microbatch
pads its samples on the right to its own longest sample, so microbatches have different
lengths; padding has loss mask 0 and, with causal attention, never influences real tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from .microbatch import Microbatch

__all__ = ["Sample", "collate", "split_fixed", "split_by_tokens",
           "global_batch_indices"]


@dataclass(frozen=True)
class Sample:
    tokens: np.ndarray
    """int64 token ids, length L + 1."""
    loss_mask: np.ndarray
    """float32 weights of the L predicted tokens (0 for prompt / padding)."""

    def __post_init__(self) -> None:
        if len(self.tokens) < 2:
            raise ValueError("a sample needs at least 2 tokens")
        assert len(self.loss_mask) == len(self.tokens) - 1

    @property
    def length(self) -> int:
        """Number of input positions (L)."""
        return len(self.tokens) - 1

    @property
    def num_loss_tokens(self) -> float:
        return float(self.loss_mask.sum())


def collate(samples: Sequence[Sample], *, pad_id: int) -> Microbatch:
    """Right-pad ``samples`` to the longest one (positions are 0..L-1 in every row)."""
    if not samples:
        raise ValueError("cannot collate an empty microbatch")
    length = max(s.length for s in samples)
    tokens = np.full((len(samples), length + 1), pad_id, dtype=np.int64)
    mask = np.zeros((len(samples), length), dtype=np.float32)
    for row, sample in enumerate(samples):
        tokens[row, :sample.length + 1] = sample.tokens
        mask[row, :sample.length] = sample.loss_mask
    tokens_t = torch.from_numpy(tokens)
    return Microbatch(tokens=tokens_t[:, :-1].contiguous(), labels=tokens_t[:, 1:].contiguous(),
                      loss_mask=torch.from_numpy(mask))


def global_batch_indices(iteration: int, global_batch_size: int) -> list[int]:
    """Sample indices of global batch ``iteration`` (0-based): consecutive, never reused."""
    start = iteration * global_batch_size
    return list(range(start, start + global_batch_size))


def split_fixed(sample_ids: Sequence[int], micro_batch_size: int) -> list[list[int]]:
    """Consecutive groups of ``micro_batch_size`` samples."""
    if len(sample_ids) % micro_batch_size:
        raise ValueError(f"{len(sample_ids)} samples do not split into microbatches of "
                         f"{micro_batch_size}")
    return [list(sample_ids[i:i + micro_batch_size])
            for i in range(0, len(sample_ids), micro_batch_size)]


def split_by_tokens(sample_ids: Sequence[int], lengths: Sequence[int],
                    max_tokens: int) -> list[list[int]]:
    """Greedy packing in order: a microbatch holds samples while ``count * longest``
    (its padded size) stays within ``max_tokens``; a longer single sample goes alone."""
    groups: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for sample_id, length in zip(sample_ids, lengths):
        new_longest = max(longest, length)
        if current and (len(current) + 1) * new_longest > max_tokens:
            groups.append(current)
            current, new_longest = [], length
        current.append(sample_id)
        longest = new_longest
    if current:
        groups.append(current)
    return groups
