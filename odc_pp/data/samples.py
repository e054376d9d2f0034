"""Samples, microbatches and the split of a global batch into variable-length microbatches.

A sample is ``tokens`` (L + 1 ids) and ``loss_mask`` (L values for the L predicted
tokens): the model reads ``tokens[:-1]`` and is scored on ``tokens[1:]``. A microbatch
pads its samples on the right to its own longest sample, so microbatches have different
lengths; padding has loss mask 0 and, with causal attention, never influences real tokens.

Packed (:func:`pack`): a microbatch is one row, its samples back to back, each sample's
``tokens[:-1]`` as inputs and ``tokens[1:]`` as labels, so no label crosses a sample
boundary (a sample's last id is only a label); ``position_ids`` restart at 0 and
``segment_ids`` number the samples, which keeps attention within a sample
(:class:`~odc_pp.data.microbatch.Microbatch`). Every input position of a packed row has
the same label and loss weight as in the padded layout, and there is no padding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from .microbatch import Microbatch

__all__ = ["Sample", "collate", "pack", "empty_row", "split_fixed", "split_by_tokens",
           "global_batch_indices"]


@dataclass(frozen=True)
class Sample:
    tokens: np.ndarray
    """int64 token ids, length L + 1."""
    loss_mask: np.ndarray
    """float32 weights of the L predicted tokens (0 for prompt / padding)."""
    position_ids: np.ndarray | None = None
    """int64 positions of the L inputs; None: ``0..L-1`` (Megatron's samples under
    --reset-position-ids restart them after each end-of-document)."""
    segment_ids: np.ndarray | None = None
    """int64 document number of each of the L inputs, attention staying within one
    (Megatron's samples under --reset-attention-mask); None: one causal sequence."""

    def __post_init__(self) -> None:
        if len(self.tokens) < 2:
            raise ValueError("a sample needs at least 2 tokens")
        assert len(self.loss_mask) == len(self.tokens) - 1
        for extra in (self.position_ids, self.segment_ids):
            assert extra is None or len(extra) == len(self.tokens) - 1

    @property
    def length(self) -> int:
        """Number of input positions (L)."""
        return len(self.tokens) - 1

    @property
    def num_loss_tokens(self) -> float:
        return float(self.loss_mask.sum())


def _round_up(length: int, multiple: int) -> int:
    return -(-length // multiple) * multiple


def collate(samples: Sequence[Sample], *, pad_id: int, multiple: int = 1,
            sample_ids: Sequence[int] | None = None) -> Microbatch:
    """Right-pad ``samples`` to the longest one, rounded up to a ``multiple`` (sequence
    parallelism splits the sequence over the tensor-parallel ranks); positions are
    0..L-1 in every row and padding carries no loss. ``sample_ids``: the samples' global
    indices (``global_token_ids``; None: not set)."""
    if not samples:
        raise ValueError("cannot collate an empty microbatch")
    length = _round_up(max(s.length for s in samples), multiple)
    tokens = np.full((len(samples), length + 1), pad_id, dtype=np.int64)
    mask = np.zeros((len(samples), length), dtype=np.float32)
    for row, sample in enumerate(samples):
        tokens[row, :sample.length + 1] = sample.tokens
        mask[row, :sample.length] = sample.loss_mask
    tokens_t = torch.from_numpy(tokens)
    return Microbatch(tokens=tokens_t[:, :-1].contiguous(), labels=tokens_t[:, 1:].contiguous(),
                      loss_mask=torch.from_numpy(mask),
                      position_ids=_rows(samples, "position_ids", length),
                      segment_ids=_rows(samples, "segment_ids", length),
                      global_token_ids=_token_ids(samples, sample_ids, length, packed=False))


def _token_ids(samples: Sequence[Sample], sample_ids: Sequence[int] | None, length: int, *,
               packed: bool) -> torch.Tensor | None:
    """``global_token_ids`` (:class:`Microbatch`) of collated rows (one sample each) or of
    one packed row of ``length`` positions; padding -1. None without ``sample_ids``."""
    if sample_ids is None:
        return None
    if len(sample_ids) != len(samples):
        raise ValueError(f"{len(sample_ids)} sample ids for {len(samples)} samples")
    ids = [(int(index) << 32) + np.arange(sample.length, dtype=np.int64)
           for index, sample in zip(sample_ids, samples)]
    if packed:
        row = np.concatenate(ids)
        return torch.from_numpy(np.pad(row, (0, length - row.size), constant_values=-1)[None])
    out = np.full((len(samples), length), -1, dtype=np.int64)
    for row, values in enumerate(ids):
        out[row, :values.size] = values
    return torch.from_numpy(out)


def _rows(samples: Sequence[Sample], name: str, length: int) -> torch.Tensor | None:
    """``[batch, length]`` of the samples' ``position_ids`` / ``segment_ids`` when any
    sample has them (others: ``0..L-1`` / segment 0); padding continues the positions and
    is segment -1. None when no sample has them."""
    if all(getattr(s, name) is None for s in samples):
        return None
    positions = name == "position_ids"
    out = np.tile(np.arange(length), (len(samples), 1)) if positions else \
        np.full((len(samples), length), -1, dtype=np.int64)
    for row, sample in enumerate(samples):
        value = getattr(sample, name)
        out[row, :sample.length] = value if value is not None else \
            (np.arange(sample.length) if positions else 0)
    return torch.from_numpy(out.astype(np.int64))


def pack(samples: Sequence[Sample], *, pad_id: int = 0, multiple: int = 1,
         sample_ids: Sequence[int] | None = None) -> Microbatch:
    """One ``[1, sum of lengths]`` row: the samples back to back, ``position_ids``
    ``0..L-1`` per sample and ``segment_ids`` 0, 1, 2, ... (see the module docstring);
    padded with ``pad_id`` (segment -1, no loss) to a ``multiple`` of positions.
    ``sample_ids``: the samples' global indices (``global_token_ids``; None: not set)."""
    if not samples:
        raise ValueError("cannot pack an empty microbatch")
    def row(parts, dtype) -> torch.Tensor:
        return torch.from_numpy(np.concatenate(parts).astype(dtype)).unsqueeze(0)

    total = sum(s.length for s in samples)
    pad = _round_up(total, multiple) - total
    return Microbatch(tokens=row([s.tokens[:-1] for s in samples] + [np.full(pad, pad_id)],
                                 np.int64),
                      labels=row([s.tokens[1:] for s in samples] + [np.full(pad, pad_id)],
                                 np.int64),
                      loss_mask=row([s.loss_mask for s in samples] + [np.zeros(pad)],
                                    np.float32),
                      position_ids=row([np.arange(s.length) for s in samples] +
                                       [np.arange(pad)], np.int64),
                      segment_ids=row([np.full(s.length, k) for k, s in enumerate(samples)] +
                                      [np.full(pad, -1)], np.int64),
                      global_token_ids=_token_ids(samples, sample_ids, total + pad,
                                                  packed=True))


def empty_row(length: int, *, pad_id: int = 0) -> Microbatch:
    """A ``[1, length]`` row of padding only (segment -1, no loss): what a lane with no
    sample runs in a slot of variable context parallelism (odc_pp.data.lanes)."""
    pads = torch.full((1, length), pad_id, dtype=torch.int64)
    return Microbatch(tokens=pads, labels=pads.clone(), loss_mask=torch.zeros(1, length),
                      position_ids=torch.arange(length).unsqueeze(0),
                      segment_ids=torch.full((1, length), -1, dtype=torch.int64),
                      global_token_ids=torch.full((1, length), -1, dtype=torch.int64))


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
                    max_tokens: int, *, packed: bool = False) -> list[list[int]]:
    """Greedy grouping in order: a microbatch holds samples while its size stays within
    ``max_tokens``: ``count * longest`` (padded rows) or, ``packed``, the sum of lengths
    (one packed row); a longer single sample goes alone."""
    groups: list[list[int]] = []
    current: list[int] = []
    longest = total = 0
    for sample_id, length in zip(sample_ids, lengths):
        new_longest = max(longest, length)
        size = total + length if packed else (len(current) + 1) * new_longest
        if current and size > max_tokens:
            groups.append(current)
            current, new_longest, total = [], length, 0
        current.append(sample_id)
        longest = new_longest
        total += length
    if current:
        groups.append(current)
    return groups
