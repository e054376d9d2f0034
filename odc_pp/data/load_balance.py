"""Load balancing of a global minibatch over data-parallel replicas and microbatches.

The building blocks of :mod:`odc_pp.data.assignment`:

1. a sample's cost from its sequence length: the one :class:`SampleCostModel` protocol
   (:class:`TokenCost`, :class:`AttentionCost`, or a :class:`FittedCost` from
   :func:`fit_cost_model` / :func:`fit_microbatch_costs`, the profiler's measured per-token
   and per-token^2 seconds), and a microbatch's cost as the runtime executes it
   (:func:`microbatch_cost`: ``count x cost(longest)`` for padded rows, ``cost(row length)``
   for a packed row, whose attention mask spans the whole row),
2. :func:`balance_minibatch`: split samples over replicas so the largest replica cost is
   small, with any sample count per replica (Karmarkar-Karp largest differencing and
   greedy LPT, each refined by pairwise moves and swaps; the better one wins),
3. :func:`balance_equal_counts`: the same goal with a fixed sample count per part
   (count-constrained LPT and the strided split, refined by swaps only),
4. :func:`pack_microbatches`: a replica's samples into microbatches under a token cap
   (first-fit decreasing; with a cost model, the microbatches' costs balanced), and
5. :func:`pack_padded`: a replica's samples into padded microbatches, longest first, so
   similar lengths share a microbatch (least padding), of a fixed sample count or under a
   padded token cap (count x longest), and
6. :func:`equal_count_balance`: the strided equal-count split (``DistributedSampler``-like).
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from .refinement import refine as refine_parts

__all__ = [
    "SampleCostModel",
    "TokenCost",
    "AttentionCost",
    "FittedCost",
    "fit_cost_model",
    "fit_microbatch_costs",
    "microbatch_cost",
    "pack_padded",
    "balance_costs",
    "balance_minibatch",
    "balance_equal_counts",
    "pack_microbatches",
    "equal_count_balance",
    "replica_costs",
    "check_lengths",
]


class SampleCostModel(Protocol):
    """The one cost model of sample assignment: the cost of a row of each length. Every
    load-balance mode weighs samples and microbatches with it (a microbatch through
    :func:`microbatch_cost`)."""

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
    fitted = _fit_nonnegative(s * s, s, t, with_constant=with_constant)
    if fitted is None:
        raise ValueError("times do not grow with length: no non-negative cost model fits "
                         "them")
    return fitted


def fit_microbatch_costs(linear: Sequence[float], quadratic: Sequence[float],
                         times: Sequence[float], *, with_constant: bool = False) -> FittedCost:
    """The sample cost model from measured microbatches (the profiler's calibration):
    non-negative least squares of ``times ~ a * quadratic + b * linear``, where each
    microbatch executed ``linear`` token positions (padded: count x longest; packed: the
    row's length) and ``quadratic`` attention positions (count x longest^2; packed: the
    row's length^2, the mask spans the row). ``a`` is then the measured seconds per
    token^2, ``b`` per token (``with_constant``: ``c`` per microbatch row too), and
    ``FittedCost(a, b, c)`` costs any microbatch through :func:`microbatch_cost`."""
    lin = np.asarray(linear, dtype=np.float64)
    quad = np.asarray(quadratic, dtype=np.float64)
    t = np.asarray(times, dtype=np.float64)
    if lin.ndim != 1 or lin.shape != quad.shape or lin.shape != t.shape or lin.size < 2:
        raise ValueError("fit_microbatch_costs needs three 1-D sequences of equal length >= 2")
    fitted = _fit_nonnegative(quad, lin, t, with_constant=with_constant)
    if fitted is None:
        raise ValueError("measured times do not grow with tokens: no non-negative cost "
                         "model fits them")
    return fitted


def _fit_nonnegative(quadratic: np.ndarray, linear: np.ndarray, times: np.ndarray, *,
                     with_constant: bool) -> FittedCost | None:
    """Least squares of ``times ~ a * quadratic + b * linear (+ c)``; a coefficient that
    comes out negative is dropped and the rest refitted (the model stays monotone). None:
    no fit with a positive coefficient."""
    columns = {"a": quadratic, "b": linear}
    if with_constant:
        columns["c"] = np.ones_like(linear)
    active = list(columns)
    while active:
        design = np.stack([columns[name] for name in active], axis=1)
        coef, *_ = np.linalg.lstsq(design, times, rcond=None)
        if (coef >= 0).all() and (coef > 0).any():
            fitted = dict(zip(active, coef.tolist()))
            return FittedCost(a=fitted.get("a", 0.0), b=fitted.get("b", 0.0),
                              c=fitted.get("c", 0.0))
        active.pop(int(np.argmin(coef)))
    return None


def microbatch_cost(group: Sequence[int], lengths: np.ndarray,
                    cost_model: SampleCostModel | None = None, *, packed: bool = False,
                    segments: bool = False) -> float:
    """Cost of one microbatch as the runtime executes it: padded rows (``packed=False``)
    run ``count x longest`` positions, i.e. ``count * cost(longest)``; a packed row runs
    its total length under one mask over the whole row (the dense kernel: CPU), i.e.
    ``cost(sum of lengths)``, or with ``segments`` (varlen / flex kernels, CUDA) each
    document's attention alone, i.e. the sum of its samples' costs."""
    if not len(group):
        return 0.0
    model = cost_model or TokenCost()
    sizes = lengths[list(group)]
    if packed and segments:
        return float(model(sizes).sum())
    if packed:
        return float(model(np.asarray([int(sizes.sum())]))[0])
    return float(len(sizes) * model(np.asarray([int(sizes.max())]))[0])


def pack_padded(sample_indices: Sequence[int], lengths: Sequence[int], *,
                samples_per_microbatch: int | None = None,
                max_tokens: int | None = None) -> list[list[int]]:
    """Padded microbatches of a replica's samples, longest first, so that similar lengths
    share a microbatch (consecutive groups of the sorted order pad least): groups of
    ``samples_per_microbatch`` samples, or as many samples as keep ``count x longest``
    within ``max_tokens`` (a longer sample goes alone: it is the runtime's row anyway).
    Exactly one of the two must be given. Each group's indices ascending."""
    array = check_lengths(lengths)
    if (samples_per_microbatch is None) == (max_tokens is None):
        raise ValueError("pack_padded needs exactly one of samples_per_microbatch and "
                         "max_tokens")
    if (samples_per_microbatch or 1) < 1 or (max_tokens or 1) < 1:
        raise ValueError("samples_per_microbatch and max_tokens must be >= 1")
    order = sorted((int(i) for i in sample_indices), key=lambda i: (-int(array[i]), i))
    groups: list[list[int]] = []
    for index in order:
        if groups and (len(groups[-1]) < samples_per_microbatch
                       if samples_per_microbatch is not None
                       else (len(groups[-1]) + 1) * int(array[groups[-1][0]]) <= max_tokens):
            groups[-1].append(index)
        else:
            groups.append([index])
    return [sorted(group) for group in groups]


def balance_costs(costs: Sequence[float], num_parts: int) -> list[list[int]]:
    """Items ``0..len(costs)-1`` (any non-negative costs, e.g. microbatch costs) over
    ``num_parts`` parts with the smallest practical largest part: Karmarkar-Karp and LPT,
    each refined by moves and swaps, the better one; no part left empty while there are
    as many items as parts. Each part's indices ascending; deterministic."""
    array = np.asarray(costs, dtype=np.float64)
    if array.ndim != 1 or (array.size and (array.min() < 0 or not np.isfinite(array).all())):
        raise ValueError("costs must be a 1-D sequence of finite numbers >= 0")
    if num_parts < 1:
        raise ValueError(f"num_parts must be >= 1, got {num_parts}")
    return _split_balanced(array, num_parts, refine=True)


def _split_balanced(costs: np.ndarray, num_parts: int, *, refine: bool) -> list[list[int]]:
    """Karmarkar-Karp and greedy LPT, each refined by moves and swaps (``refine``) and left
    without empty parts: the better one (:func:`_best_split`)."""
    candidates = [_karmarkar_karp(costs, num_parts), _longest_processing_time(costs, num_parts)]
    for subsets in candidates:
        if refine:
            refine_parts(subsets, costs)
        _fill_empty(subsets, costs)
    return _best_split(candidates, costs)


def _best_split(candidates: list[list[list[int]]], costs: np.ndarray) -> list[list[int]]:
    """The candidate with the smallest largest part cost, then the smallest spread (ties:
    the earlier candidate); each part's indices ascending."""
    def score(subsets: list[list[int]]) -> tuple[float, float]:
        loads = [float(costs[s].sum()) if s else 0.0 for s in subsets]
        return max(loads), max(loads) - min(loads)

    return [sorted(subset) for subset in min(candidates, key=score)]


def _fill_empty(subsets: list[list[int]], costs: np.ndarray) -> None:
    """Give every empty part one item (the cheapest item of the part with the most items)
    while some part holds two or more: a replica without samples would run no
    microbatch at all (verl #6786: 9 sequences over 4 ranks must not leave one empty)."""
    while True:
        empty = [p for p, s in enumerate(subsets) if not s]
        donors = [p for p, s in enumerate(subsets) if len(s) > 1]
        if not empty or not donors:
            return
        donor = max(donors, key=lambda p: (len(subsets[p]), -p))
        item = min(subsets[donor], key=lambda i: (float(costs[i]), i))
        subsets[donor].remove(item)
        subsets[empty[0]].append(item)


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


def check_lengths(lengths: Sequence[int]) -> np.ndarray:
    """``lengths`` as an int64 array; ValueError unless a 1-D sequence of positive ints."""
    array = np.asarray(lengths)
    if array.ndim != 1:
        raise ValueError("lengths must be a 1-D sequence of sequence lengths")
    if array.size and (array.min() <= 0 or not np.issubdtype(array.dtype, np.integer)):
        raise ValueError("lengths must be positive integers (tokens per sample)")
    return array.astype(np.int64)


_REMEMBERED: OrderedDict = OrderedDict()
_REMEMBER = 256
"""How many recent splits :func:`_remembered` keeps (a few MB at most)."""


def _remembered(split):
    """``split`` with its recent results kept: the same lengths, part count, cost model
    and options give the same parts, so the planner, which asks again for every layout
    that shares a sampled minibatch, computes each once. Copies are returned; a cost
    model that cannot be hashed is not remembered."""
    @functools.wraps(split)
    def wrapper(lengths, num_parts, cost_model=None, **options):
        array = np.asarray(lengths)
        key = (split.__name__, array.dtype.str, array.shape, array.tobytes(), num_parts,
               cost_model, tuple(sorted((name, tuple(value) if isinstance(value, list)
                                         else value) for name, value in options.items())))
        try:
            parts = _REMEMBERED.get(key)
        except TypeError:
            return split(lengths, num_parts, cost_model, **options)
        if parts is None:
            parts = split(lengths, num_parts, cost_model, **options)
            _REMEMBERED[key] = parts
            if len(_REMEMBERED) > _REMEMBER:
                _REMEMBERED.popitem(last=False)
        else:
            _REMEMBERED.move_to_end(key)
        return [list(part) for part in parts]
    return wrapper


@_remembered
def balance_minibatch(lengths: Sequence[int], num_replicas: int,
                      cost_model: SampleCostModel | None = None, *,
                      refine: bool = True) -> list[list[int]]:
    """Split sample indices ``0..len(lengths)-1`` across ``num_replicas`` replicas so the
    largest per-replica total cost is as small as practical.

    Runs Karmarkar-Karp largest differencing and greedy LPT, refines both with pairwise
    moves and swaps, and returns the one with the smaller maximum (then smaller spread).
    Each replica's indices are sorted ascending. Replicas may get different sample counts.
    """
    array = check_lengths(lengths)
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
    costs = (cost_model or TokenCost())(array).astype(np.float64)
    return _split_balanced(costs, num_replicas, refine=refine)


def _count_constrained_lpt(costs: np.ndarray, counts: Sequence[int]) -> list[list[int]]:
    """Greedy LPT where part ``p`` takes exactly ``counts[p]`` samples: each sample, largest
    first, to the least loaded part that still has room (ties: lower part index)."""
    loads = [0.0] * len(counts)
    subsets: list[list[int]] = [[] for _ in counts]
    for index in np.argsort(-costs, kind="stable"):
        part = min((p for p in range(len(counts)) if len(subsets[p]) < counts[p]),
                   key=lambda p: (loads[p], p))
        subsets[part].append(int(index))
        loads[part] += float(costs[index])
    return subsets


@_remembered
def balance_equal_counts(lengths: Sequence[int], num_parts: int,
                         cost_model: SampleCostModel | None = None, *,
                         counts: Sequence[int] | None = None) -> list[list[int]]:
    """Split sample indices ``0..len(lengths)-1`` into ``num_parts`` parts of fixed sizes
    (``counts``; default as equal as possible, the first ``n % num_parts`` parts one larger)
    so the largest part cost is small.

    Candidates: count-constrained greedy LPT and the strided split (part ``p`` takes
    ``p, p + k, ...``, only when ``counts`` is the default), each refined by pairwise swaps;
    the one with the smaller maximum (then smaller spread, then the LPT one) wins, so the
    result is never worse than the strided split. Each part's indices are sorted ascending.
    Deterministic: the same input gives the same parts on every rank.
    """
    array = check_lengths(lengths)
    if num_parts < 1:
        raise ValueError(f"num_parts must be >= 1, got {num_parts}")
    n = int(array.size)
    default = [n // num_parts + (1 if p < n % num_parts else 0) for p in range(num_parts)]
    if counts is None:
        counts = default
    counts = [int(c) for c in counts]
    if len(counts) != num_parts or min(counts) < 0 or sum(counts) != n:
        raise ValueError(f"counts {counts} must be {num_parts} non-negative sizes adding up "
                         f"to the {n} samples")
    costs = (cost_model or TokenCost())(array).astype(np.float64)
    candidates = [_count_constrained_lpt(costs, counts)]
    if counts == default:
        candidates.append([list(range(p, n, num_parts)) for p in range(num_parts)])
    for subsets in candidates:
        refine_parts(subsets, costs, moves=False)
    return _best_split(candidates, costs)


def pack_microbatches(sample_indices: Sequence[int], lengths: Sequence[int],
                      max_tokens: int, cost_model: SampleCostModel | None = None, *,
                      row_cost: bool = False, segments: bool = False) -> list[list[int]]:
    """Pack samples into microbatches of at most ``max_tokens`` tokens (sequences packed
    back to back, no padding). Returns lists of sample indices, largest microbatch first;
    an empty input gives no microbatches.

    Without ``cost_model``: first-fit decreasing by tokens (fewest microbatches). With one:
    as many microbatches as first-fit decreasing needs (more only if the cap forces it),
    their costs balanced (by the sum of its samples' costs): each sample, costliest first,
    to the cheapest microbatch with room for its tokens. With ``row_cost`` as well, the
    row count is chosen by what the rows cost as executed (``cost(row length)``: under a
    row-wide attention mask packing more rows together costs more attention, and a fitted
    per-row constant ``c`` costs fewer rows less)."""
    array = check_lengths(lengths)
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
    if cost_model is None or (len(bins) < 2 and not row_cost):
        return bins
    costs = cost_model(array).astype(np.float64)
    if row_cost:
        return _rows_by_cost(indices, array, costs, max_tokens, cost_model, len(bins),
                             segments)
    for count in range(len(bins), len(indices) + 1):
        balanced = _cost_balanced_bins(indices, array, costs, max_tokens, count)
        if balanced is not None:
            return sorted(balanced, key=lambda b: (-float(costs[b].sum()), b))
    raise AssertionError("one sample per microbatch always fits")


def _rows_by_cost(indices: list[int], lengths: np.ndarray, costs: np.ndarray,
                  max_tokens: int, cost_model, fewest: int,
                  segments: bool = False) -> list[list[int]]:
    """The row count whose cost-balanced packing costs least as executed (each row
    ``cost(row length)``; ties: fewer rows). Counts tried: ``fewest`` up to twice that,
    and one sample per row."""
    best = None
    counts = sorted(set(range(fewest, min(len(indices), 2 * fewest) + 1)) | {len(indices)})
    for count in counts:
        rows = _cost_balanced_bins(indices, lengths, costs, max_tokens, count)
        if rows is None:
            continue
        total = sum(microbatch_cost(r, lengths, cost_model, packed=True, segments=segments)
                    for r in rows)
        if best is None or total < best[0] * (1 - 1e-9):
            best = (total, rows)
    return sorted(best[1], key=lambda b: (-float(costs[b].sum()), b))


def _cost_balanced_bins(indices: list[int], lengths: np.ndarray, costs: np.ndarray,
                        max_tokens: int, count: int) -> list[list[int]] | None:
    """LPT into ``count`` bins under the token cap (ties: fewer tokens, then lower bin);
    None when some sample fits no bin."""
    bins: list[list[int]] = [[] for _ in range(count)]
    loads = [0.0] * count
    tokens = [0] * count
    for index in sorted(indices, key=lambda i: (-float(costs[i]), i)):
        room = [b for b in range(count) if tokens[b] + int(lengths[index]) <= max_tokens]
        if not room:
            return None
        target = min(room, key=lambda b: (loads[b], tokens[b], b))
        bins[target].append(index)
        loads[target] += float(costs[index])
        tokens[target] += int(lengths[index])
    return [sorted(b) for b in bins if b]


def equal_count_balance(lengths: Sequence[int], num_replicas: int,
                        samples_per_microbatch: int) -> list[list[list[int]]]:
    """The baseline that per-layer collectives need: every replica gets the same number of
    samples (replica r takes samples r, r+R, r+2R, ... like ``DistributedSampler``) cut into
    microbatches of ``samples_per_microbatch`` samples, so every replica runs the same number
    of microbatches regardless of their lengths. Returns [replica][microbatch] -> indices."""
    array = check_lengths(lengths)
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


def replica_costs(microbatches: list[list[list[int]]], lengths: Sequence[int],
                  cost_model: SampleCostModel | None = None, *,
                  packed: bool = False, segments: bool = False) -> list[float]:
    """Total cost of each replica's microbatches as the runtime executes them
    (:func:`microbatch_cost`: padded rows, or packed rows with ``packed``)."""
    array = check_lengths(lengths)
    return [float(sum(microbatch_cost(mb, array, cost_model, packed=packed, segments=segments)
                      for mb in replica)) for replica in microbatches]
