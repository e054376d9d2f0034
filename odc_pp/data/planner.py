"""The minibatch planner: which samples each data-parallel replica runs, microbatch by
microbatch. One planner serves the public API (:func:`plan_minibatch`) and the training
frontend (``odc_pp.training.data_plan.DataPlanner`` maps its flags onto it).

Modes (``--load-balance``):

* ``none``: the strided equal-count split (replica ``r`` takes samples ``r, r + R, ...``
  like ``DistributedSampler``), cut into microbatches of ``samples_per_microbatch``
  samples, or, without it, packed in order under the padded token cap.
* ``lb-mini``: replicas balanced by the cost model with any sample and microbatch count
  per replica (ODC waits once per minibatch, so counts may differ), each replica's
  samples packed under the token cap.
* ``balanced``: replicas balanced by the cost model with equal sample counts, then every
  replica split into the *same* number of microbatches (the rule of verl, slime and
  OpenRLHF): valid with per-layer collectives (``collective`` mode, FSDP) too.

With ``packed=True`` (``--pack-sequences``: each microbatch becomes one row of samples
back to back, :func:`~odc_pp.data.samples.pack`) a microbatch's size is the sum of its
lengths everywhere, and ``lb-mini`` packs each replica's microbatches by the cost model
(their costs balanced, :func:`~odc_pp.data.load_balance.pack_microbatches`): the cost of a
packed row is the sum of its samples' costs, not that of a padded square.

Under pipeline parallelism every stage of one pipeline shares its data-parallel rank's
data: use the same replica plan on all stages (:meth:`MinibatchPlan.for_replica`). Every
function here is a pure function of its inputs, so every rank computes the same plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .load_balance import (CostModel, TokenCost, balance_equal_counts, balance_minibatch,
                           check_lengths, equal_count_balance, pack_microbatches,
                           replica_costs)
from .samples import split_by_tokens

__all__ = ["LOAD_BALANCE_MODES", "MinibatchPlan", "plan_minibatch"]

LOAD_BALANCE_MODES = ("none", "lb-mini", "balanced")
"""Choices of ``--load-balance`` / ``plan_minibatch(mode=...)``."""


@dataclass(kw_only=True)
class MinibatchPlan:
    """Which samples each data-parallel replica runs, microbatch by microbatch."""

    microbatches: list[list[list[int]]]
    """[replica][microbatch] -> sample indices into the global minibatch (ascending)."""
    costs: list[float] = field(default_factory=list)
    """Total estimated cost per replica."""

    @property
    def num_replicas(self) -> int:
        return len(self.microbatches)

    @property
    def max_microbatches(self) -> int:
        return max((len(mbs) for mbs in self.microbatches), default=0)

    def for_replica(self, replica: int) -> list[list[int]]:
        """Microbatches of data-parallel rank ``replica`` (same on every pipeline stage)."""
        return self.microbatches[replica]

    @property
    def imbalance(self) -> float:
        """max / mean replica cost (1.0 is perfect)."""
        mean = sum(self.costs) / len(self.costs) if self.costs else 0.0
        return max(self.costs) / mean if mean > 0 else 1.0


def plan_minibatch(lengths: Sequence[int], num_replicas: int, *, max_tokens: int,
                   mode: str = "lb-mini", cost_model: CostModel | None = None,
                   samples_per_microbatch: int | None = None,
                   min_microbatches: int = 1, packed: bool = False) -> MinibatchPlan:
    """Plan one global minibatch of samples with token counts ``lengths``.

    ``max_tokens`` caps a microbatch's tokens (the sum of lengths; unpacked ``none``
    without ``samples_per_microbatch``: padded, count x longest). ``samples_per_microbatch`` gives
    ``none`` and ``balanced`` fixed-size microbatches (the sample count must then split
    equally over the replicas); ``lb-mini`` always packs by tokens. ``min_microbatches``
    (a pipeline needs at least pp) splits microbatches further where samples allow
    (``lb-mini``, token-capped ``balanced`` and token-capped packed ``none``).
    ``cost_model`` (default tokens) weighs samples when replicas are balanced (and, packed,
    ``lb-mini``'s microbatches). ``packed``: microbatches become packed rows (see the
    module docstring).
    """
    if mode not in LOAD_BALANCE_MODES:
        raise ValueError(f"load-balance mode {mode!r} is not one of {LOAD_BALANCE_MODES}")
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if samples_per_microbatch is not None and samples_per_microbatch < 1:
        raise ValueError(f"samples_per_microbatch must be >= 1, got {samples_per_microbatch}")
    if min_microbatches < 1:
        raise ValueError(f"min_microbatches must be >= 1, got {min_microbatches}")
    array = check_lengths(lengths)
    if mode == "none":
        microbatches = _strided(array, num_replicas, max_tokens, samples_per_microbatch,
                                packed)
        if packed and samples_per_microbatch is None:  # packed rows hold more samples
            microbatches = [_split_until(groups, min_microbatches, array)
                            for groups in microbatches]
    elif mode == "lb-mini":
        microbatches = []
        for indices in balance_minibatch(array, num_replicas, cost_model):
            groups = pack_microbatches(indices, array, max_tokens,
                                       (cost_model or TokenCost()) if packed else None)
            groups = _split_until(groups, min_microbatches, array)
            microbatches.append([sorted(group) for group in groups])
    else:
        microbatches = _balanced(array, num_replicas, max_tokens, cost_model,
                                 samples_per_microbatch, min_microbatches)
    return MinibatchPlan(microbatches=microbatches,
                         costs=replica_costs(microbatches, array, cost_model))


def _strided(lengths: np.ndarray, num_replicas: int, max_tokens: int,
             samples_per_microbatch: int | None, packed: bool) -> list[list[list[int]]]:
    if samples_per_microbatch is None:
        positions = list(range(len(lengths)))
        return [split_by_tokens(positions[r::num_replicas],
                                [int(v) for v in lengths[r::num_replicas]], max_tokens,
                                packed=packed)
                for r in range(num_replicas)]
    microbatches = equal_count_balance(lengths, num_replicas, samples_per_microbatch)
    _check_cap(microbatches, lengths, max_tokens, "equal-count")
    return microbatches


def _balanced(lengths: np.ndarray, num_replicas: int, max_tokens: int,
              cost_model: CostModel | None, samples_per_microbatch: int | None,
              min_microbatches: int) -> list[list[list[int]]]:
    """Cost-balanced replicas of equal sample count, each cut into the same number of
    token-balanced microbatches."""
    n = len(lengths)
    if n < num_replicas:
        raise ValueError(f"{n} samples cannot give each of {num_replicas} replicas one")
    if samples_per_microbatch is not None and n % num_replicas:
        raise ValueError(f"{n} samples do not split equally over {num_replicas} replicas; "
                         f"make the global minibatch a multiple of {num_replicas}")
    replicas = balance_equal_counts(lengths, num_replicas, cost_model)
    if samples_per_microbatch is not None:
        size = len(replicas[0])
        full, rest = divmod(size, samples_per_microbatch)
        counts = [samples_per_microbatch] * full + ([rest] if rest else [])
        microbatches = [_split_replica(lengths, indices, counts) for indices in replicas]
        _check_cap(microbatches, lengths, max_tokens, "balanced")
        return microbatches
    fewest = min(len(indices) for indices in replicas)
    count = max(max(len(pack_microbatches(indices, lengths, max_tokens))
                    for indices in replicas), min(min_microbatches, fewest))
    while count <= fewest:
        microbatches = [_split_replica(lengths, indices, None, count) for indices in replicas]
        if all(int(lengths[mb].sum()) <= max_tokens for replica in microbatches
               for mb in replica):
            return microbatches
        count += 1
    raise ValueError(f"balanced: cannot cut every replica into the same number of "
                     f"microbatches of at most max_tokens={max_tokens} tokens (replicas hold "
                     f"{fewest}..{max(len(r) for r in replicas)} samples); raise max_tokens "
                     f"or make the global minibatch a multiple of {num_replicas}")


def _split_replica(lengths: np.ndarray, indices: list[int], counts: list[int] | None,
                   num_microbatches: int | None = None) -> list[list[int]]:
    """A replica's samples in token-balanced microbatches: of sizes ``counts``, or
    ``num_microbatches`` non-empty ones of any size; largest microbatch first."""
    sub = lengths[indices]
    if counts is not None:
        parts = balance_equal_counts(sub, len(counts), counts=counts)
    else:
        parts = balance_minibatch(sub, num_microbatches)
        if any(not part for part in parts):  # only with fewer samples than microbatches
            parts = balance_equal_counts(sub, num_microbatches)
    groups = [sorted(indices[i] for i in part) for part in parts]
    return sorted(groups, key=lambda g: (-int(lengths[g].sum()), g))


def _check_cap(microbatches: list[list[list[int]]], lengths: np.ndarray, max_tokens: int,
               what: str) -> None:
    for replica in microbatches:
        for mb in replica:
            if int(lengths[mb].sum()) > max_tokens:
                raise ValueError(f"{what} microbatch {mb} has {int(lengths[mb].sum())} "
                                 f"tokens > max_tokens={max_tokens}; lower "
                                 f"samples_per_microbatch or raise max_tokens")


def _split_until(groups: list[list[int]], minimum: int, lengths) -> list[list[int]]:
    """Split multi-sample microbatches (largest first) until there are ``minimum``
    microbatches or every microbatch holds one sample: a pipeline needs at least pp."""
    groups = [list(g) for g in groups]
    while len(groups) < minimum:
        splittable = [g for g in groups if len(g) > 1]
        if not splittable:
            break
        largest = max(splittable, key=lambda g: sum(lengths[i] for i in g))
        groups.remove(largest)
        half = len(largest) // 2
        groups += [largest[:half], largest[half:]]
    return groups
