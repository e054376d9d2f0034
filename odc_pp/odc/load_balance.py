"""Minibatch-level load balancing for data-parallel replicas.

With ODC, data-parallel replicas wait for each other once per minibatch, so a replica may
run any number of microbatches: what matters is that every replica's *total* cost is about
the same. This module

1. estimates a sample's cost from its sequence length (:class:`TokenCost`,
   :class:`AttentionCost`, or a :class:`FittedCost` from :func:`fit_cost_model`),
2. splits a global minibatch across replicas so the largest replica cost is small
   (:func:`balance_minibatch`: Karmarkar-Karp largest differencing, also greedy LPT, each
   refined by pairwise moves and swaps; the better one wins),
3. packs each replica's samples into microbatches under a token cap
   (:func:`pack_microbatches`, first-fit decreasing), and
4. offers the equal-count split that per-layer collectives (FSDP) need as the baseline
   (:func:`equal_count_balance`).

Under pipeline parallelism every stage of one pipeline shares its data-parallel rank's data:
use the same replica plan on all stages of a pipeline (:meth:`MinibatchPlan.for_replica`).
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np

__all__ = [
    "CostModel",
    "TokenCost",
    "AttentionCost",
    "FittedCost",
    "fit_cost_model",
    "balance_minibatch",
    "pack_microbatches",
    "equal_count_balance",
    "MinibatchPlan",
    "plan_minibatch",
    "replica_costs",
]


class CostModel(Protocol):
    def __call__(self, lengths: np.ndarray) -> np.ndarray:
        """Cost of each sample, given an array of sequence lengths."""


@dataclass(kw_only=True, frozen=True)
class TokenCost:
    """Cost = number of tokens (linear layers dominate)."""

    def __call__(self, lengths: np.ndarray) -> np.ndarray:
        return np.asarray(lengths, dtype=np.float64)


@dataclass(kw_only=True, frozen=True)
class AttentionCost:
    """Cost = s + quadratic_coef * s^2 (linear layers plus attention scores)."""

    quadratic_coef: float
    """Weight of the s^2 attention term relative to one token of linear work; for a
    transformer with hidden size h this is roughly 1 / (6 h) (attention flops over MLP +
    projection flops per token)."""

    def __post_init__(self) -> None:
        if not (self.quadratic_coef >= 0 and math.isfinite(self.quadratic_coef)):
            raise ValueError(f"quadratic_coef must be a finite number >= 0, got "
                             f"{self.quadratic_coef}")

    def __call__(self, lengths: np.ndarray) -> np.ndarray:
        s = np.asarray(lengths, dtype=np.float64)
        return s + self.quadratic_coef * s * s


@dataclass(kw_only=True, frozen=True)
class FittedCost:
    """Cost = a * s^2 + b * s + c, usually measured seconds fitted by :func:`fit_cost_model`."""

    a: float
    """Quadratic coefficient (attention)."""
    b: float
    """Linear coefficient (per-token work)."""
    c: float = 0.0
    """Fixed cost per sample (kernel launches, per-sequence overhead)."""

    def __post_init__(self) -> None:
        for name in ("a", "b", "c"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"FittedCost.{name} must be a finite number >= 0, got {value}")
        if self.a == 0 and self.b == 0 and self.c == 0:
            raise ValueError("FittedCost needs at least one positive coefficient")

    def __call__(self, lengths: np.ndarray) -> np.ndarray:
        s = np.asarray(lengths, dtype=np.float64)
        return self.a * s * s + self.b * s + self.c


def fit_cost_model(lengths: Sequence[float], times: Sequence[float], *,
                   with_constant: bool = False) -> FittedCost:
    """Non-negative least-squares fit of ``times ~ a s^2 + b s (+ c)``.

    Coefficients that would come out negative are dropped and the rest refitted, so the
    model stays monotone in ``s``.
    """
    s = np.asarray(lengths, dtype=np.float64)
    t = np.asarray(times, dtype=np.float64)
    if s.ndim != 1 or s.shape != t.shape or s.size < 2:
        raise ValueError("fit_cost_model needs two 1-D sequences of equal length >= 2")
    columns = {"a": s * s, "b": s}
    if with_constant:
        columns["c"] = np.ones_like(s)
    active = list(columns)
    while active:
        design = np.stack([columns[name] for name in active], axis=1)
        coef, *_ = np.linalg.lstsq(design, t, rcond=None)
        if (coef >= 0).all():
            fitted = dict(zip(active, coef.tolist()))
            return FittedCost(a=fitted.get("a", 0.0), b=fitted.get("b", 0.0),
                              c=fitted.get("c", 0.0))
        active.pop(int(np.argmin(coef)))
    raise ValueError("times do not grow with length: no non-negative cost model fits them")


# ----- k-way partitioning ------------------------------------------------------------------

def _karmarkar_karp(costs: np.ndarray, num_replicas: int) -> list[list[int]]:
    """Largest differencing method for k-way number partitioning."""
    heap: list[tuple[float, int, list[float], list[list[int]]]] = []
    counter = itertools.count()
    for index in np.argsort(-costs, kind="stable"):
        sums = [float(costs[index])] + [0.0] * (num_replicas - 1)
        subsets = [[int(index)]] + [[] for _ in range(num_replicas - 1)]
        heapq.heappush(heap, (-(sums[0] - sums[-1]), next(counter), sums, subsets))
    while len(heap) > 1:
        _, _, sums_a, subsets_a = heapq.heappop(heap)
        _, _, sums_b, subsets_b = heapq.heappop(heap)
        # Largest of one with the smallest of the other: differences cancel.
        merged = sorted(
            ((sums_a[i] + sums_b[-1 - i], subsets_a[i] + subsets_b[-1 - i])
             for i in range(num_replicas)),
            key=lambda item: -item[0])
        sums = [item[0] for item in merged]
        subsets = [item[1] for item in merged]
        heapq.heappush(heap, (-(sums[0] - sums[-1]), next(counter), sums, subsets))
    return heap[0][3] if heap else [[] for _ in range(num_replicas)]


def _longest_processing_time(costs: np.ndarray, num_replicas: int) -> list[list[int]]:
    """Greedy LPT: each sample, largest first, to the least loaded replica."""
    loads = [(0.0, replica) for replica in range(num_replicas)]
    subsets: list[list[int]] = [[] for _ in range(num_replicas)]
    for index in np.argsort(-costs, kind="stable"):
        load, replica = heapq.heappop(loads)
        subsets[replica].append(int(index))
        heapq.heappush(loads, (load + float(costs[index]), replica))
    return subsets


def _refine(subsets: list[list[int]], costs: np.ndarray, max_rounds: int = 1000) -> None:
    """Pairwise moves and swaps, each strictly lowering the larger load of the pair.

    Every accepted step makes the descending-sorted load vector lexicographically smaller,
    so this terminates; ``max_rounds`` only bounds the work on large inputs.
    """
    loads = [float(costs[s].sum()) if s else 0.0 for s in subsets]
    tolerance = 1e-12 * max(1.0, float(costs.sum()))
    for _ in range(max_rounds):
        order = sorted(range(len(subsets)), key=lambda r: -loads[r])
        if not _improve_any(subsets, loads, costs, order, tolerance):
            return


def _improve_any(subsets, loads, costs, order, tolerance) -> bool:
    for position, high in enumerate(order):
        for low in reversed(order[position + 1:]):
            gap = loads[high] - loads[low]
            if gap <= tolerance:
                continue
            if _best_exchange(subsets, loads, costs, high, low, gap, tolerance):
                return True
    return False


def _best_exchange(subsets, loads, costs, high, low, gap, tolerance) -> bool:
    """Apply the move/swap between ``high`` and ``low`` whose transfer is closest to gap/2."""
    best_delta, best_pair = 0.0, None
    low_items = [None] + subsets[low]
    for out_item in subsets[high]:
        for in_item in low_items:
            delta = float(costs[out_item]) - (0.0 if in_item is None else float(costs[in_item]))
            # New larger load is max(high - delta, low + delta) < high iff 0 < delta < gap.
            if tolerance < delta < gap - tolerance and abs(gap / 2 - delta) < abs(gap / 2 - best_delta):
                best_delta, best_pair = delta, (out_item, in_item)
    if best_pair is None:
        return False
    out_item, in_item = best_pair
    subsets[high].remove(out_item)
    subsets[low].append(out_item)
    if in_item is not None:
        subsets[low].remove(in_item)
        subsets[high].append(in_item)
    loads[high] -= best_delta
    loads[low] += best_delta
    return True


def _check_lengths(lengths: Sequence[int]) -> np.ndarray:
    array = np.asarray(lengths)
    if array.ndim != 1:
        raise ValueError("lengths must be a 1-D sequence of sequence lengths")
    if array.size and (array.min() <= 0 or not np.issubdtype(array.dtype, np.integer)):
        raise ValueError("lengths must be positive integers (tokens per sample)")
    return array.astype(np.int64)


def balance_minibatch(lengths: Sequence[int], num_replicas: int,
                      cost_model: CostModel | None = None, *,
                      refine: bool = True) -> list[list[int]]:
    """Split sample indices ``0..len(lengths)-1`` across ``num_replicas`` replicas so the
    largest per-replica total cost is as small as practical.

    Runs Karmarkar-Karp largest differencing and greedy LPT, refines both with pairwise
    moves and swaps, and returns the one with the smaller maximum (then smaller spread).
    Each replica's indices are sorted ascending. Replicas may get different sample counts.
    """
    array = _check_lengths(lengths)
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
    costs = (cost_model or TokenCost())(array).astype(np.float64)
    candidates = [_karmarkar_karp(costs, num_replicas),
                  _longest_processing_time(costs, num_replicas)]
    if refine:
        for subsets in candidates:
            _refine(subsets, costs)

    def score(subsets: list[list[int]]) -> tuple[float, float]:
        loads = [float(costs[s].sum()) if s else 0.0 for s in subsets]
        return max(loads), max(loads) - min(loads)

    best = min(candidates, key=score)
    return [sorted(subset) for subset in best]


def pack_microbatches(sample_indices: Sequence[int], lengths: Sequence[int],
                      max_tokens: int) -> list[list[int]]:
    """Pack samples into microbatches of at most ``max_tokens`` tokens (sequences packed
    back to back, no padding), first-fit decreasing. Returns lists of sample indices,
    largest microbatch first; an empty input gives no microbatches."""
    array = _check_lengths(lengths)
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    indices = [int(i) for i in sample_indices]
    too_long = [i for i in indices if array[i] > max_tokens]
    if too_long:
        raise ValueError(f"sample {too_long[0]} has {int(array[too_long[0]])} tokens, more than "
                         f"max_tokens={max_tokens}; raise max_tokens or truncate the sample")
    bins: list[list[int]] = []
    free: list[int] = []
    for index in sorted(indices, key=lambda i: (-int(array[i]), i)):
        length = int(array[index])
        for position, space in enumerate(free):
            if length <= space:
                bins[position].append(index)
                free[position] -= length
                break
        else:
            bins.append([index])
            free.append(max_tokens - length)
    return bins


def equal_count_balance(lengths: Sequence[int], num_replicas: int,
                        samples_per_microbatch: int) -> list[list[list[int]]]:
    """The baseline that per-layer collectives need: every replica gets the same number of
    samples (replica r takes samples r, r+R, r+2R, ... like ``DistributedSampler``) cut into
    microbatches of ``samples_per_microbatch`` samples, so every replica runs the same number
    of microbatches regardless of their lengths. Returns [replica][microbatch] -> indices."""
    array = _check_lengths(lengths)
    if num_replicas < 1 or samples_per_microbatch < 1:
        raise ValueError("num_replicas and samples_per_microbatch must be >= 1")
    if array.size % num_replicas:
        raise ValueError(f"{array.size} samples do not split equally over {num_replicas} "
                         f"replicas; make the global minibatch a multiple of {num_replicas}")
    plan = []
    for replica in range(num_replicas):
        mine = list(range(replica, array.size, num_replicas))
        plan.append([mine[i:i + samples_per_microbatch]
                     for i in range(0, len(mine), samples_per_microbatch)])
    return plan


@dataclass(kw_only=True)
class MinibatchPlan:
    """Which samples each data-parallel replica runs, microbatch by microbatch."""

    microbatches: list[list[list[int]]]
    """[replica][microbatch] -> sample indices into the global minibatch."""
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


def replica_costs(microbatches: list[list[list[int]]], lengths: Sequence[int],
                  cost_model: CostModel | None = None) -> list[float]:
    """Total estimated cost of each replica's samples."""
    costs = (cost_model or TokenCost())(_check_lengths(lengths))
    return [float(sum(costs[i] for mb in replica for i in mb)) for replica in microbatches]


def plan_minibatch(lengths: Sequence[int], num_replicas: int, *, max_tokens: int,
                   cost_model: CostModel | None = None, balance: bool = True,
                   samples_per_microbatch: int = 1) -> MinibatchPlan:
    """Balanced plan (``balance=True``: :func:`balance_minibatch` then
    :func:`pack_microbatches` per replica) or the equal-count baseline
    (:func:`equal_count_balance` with ``samples_per_microbatch``)."""
    if balance:
        replicas = balance_minibatch(lengths, num_replicas, cost_model)
        microbatches = [pack_microbatches(indices, lengths, max_tokens) for indices in replicas]
    else:
        microbatches = equal_count_balance(lengths, num_replicas, samples_per_microbatch)
        array = _check_lengths(lengths)
        for replica in microbatches:
            for mb in replica:
                if int(array[mb].sum()) > max_tokens:
                    raise ValueError(f"equal-count microbatch {mb} has {int(array[mb].sum())} "
                                     f"tokens > max_tokens={max_tokens}; lower "
                                     f"samples_per_microbatch or raise max_tokens")
    return MinibatchPlan(microbatches=microbatches,
                         costs=replica_costs(microbatches, lengths, cost_model))
