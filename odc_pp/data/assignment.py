"""Sample assignment: which samples each data-parallel replica runs, microbatch by
microbatch. One function serves the public API (:func:`plan_minibatch`) and the training
frontend (``odc_pp.training.data_plan.BatchAssigner`` maps its flags onto it).

Modes (``--load-balance``):

* ``none``: the strided equal-count split (replica ``r`` takes samples ``r, r + R, ...``
  like ``DistributedSampler``), cut into microbatches of ``samples_per_microbatch``
  samples, or, without it, packed in order under the padded token cap.
* ``lb-mini``: replicas balanced by the cost model with any sample and microbatch count
  per replica (ODC waits once per minibatch, so counts may differ). Unpacked, microbatches
  are padded rows of similar lengths (:func:`~odc_pp.data.load_balance.pack_padded`:
  ``samples_per_microbatch`` samples, or ``count x longest`` within the token cap) and
  the replicas are balanced by what they execute: the better of balancing samples then
  grouping, and grouping then balancing the groups, by the largest replica's padded cost.
* ``balanced``: replicas balanced by the cost model with equal sample counts, then every
  replica split into the *same* number of microbatches (the rule of verl, slime and
  OpenRLHF): valid with per-layer collectives (``collective`` mode, FSDP) too.

With ``packed=True`` (``--pack-sequences``: each microbatch becomes one row of samples
back to back, :func:`~odc_pp.data.samples.pack`) a microbatch's size is the sum of its
lengths everywhere, and ``lb-mini`` packs each replica's microbatches by the cost model
(their costs balanced, :func:`~odc_pp.data.load_balance.pack_microbatches`), with the row
count that costs least as executed: under the row-wide mask an attention-heavy model is
cheapest in short rows, a fitted per-row constant favours fewer rows, a tokens-only model
packs fullest.

Every mode costs a microbatch the way the runtime executes it
(:func:`~odc_pp.data.load_balance.microbatch_cost`): a padded microbatch runs ``count x
longest`` positions and ``count x longest^2`` attention, a packed row its length and
length^2 (the packed mask spans the row). :attr:`MinibatchPlan.costs` reports that.

Under pipeline parallelism every stage of one pipeline shares its data-parallel rank's
data: use the same replica plan on all stages (:meth:`MinibatchPlan.for_replica`). Every
function here is a pure function of its inputs, so every rank computes the same plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .load_balance import (SampleCostModel, TokenCost, balance_costs, balance_equal_counts,
                           balance_minibatch, check_lengths, equal_count_balance,
                           microbatch_cost, pack_microbatches, pack_padded, replica_costs)

__all__ = ["LOAD_BALANCE_MODES", "MinibatchPlan", "plan_minibatch"]

LOAD_BALANCE_MODES = ("none", "lb-mini", "balanced")
"""Choices of ``--load-balance`` / ``plan_minibatch(mode=...)``."""


@dataclass(kw_only=True)
class MinibatchPlan:
    """Which samples each data-parallel replica runs, microbatch by microbatch."""

    microbatches: list[list[list[int]]]
    """[replica][microbatch] -> sample indices into the global minibatch (ascending)."""
    costs: list[float] = field(default_factory=list)
    """Total estimated cost per replica, as executed (padded or packed rows)."""

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
                   mode: str = "lb-mini", cost_model: SampleCostModel | None = None,
                   samples_per_microbatch: int | None = None,
                   min_microbatches: int = 1, packed: bool = False,
                   segment_attention: bool = False) -> MinibatchPlan:
    """Plan one global minibatch of samples with token counts ``lengths``.

    ``max_tokens`` caps a microbatch's tokens: padded, ``count x longest``, or packed,
    the row's length. ``samples_per_microbatch`` gives fixed-size microbatches (``none``
    and ``balanced``: the sample count must then split equally over the replicas;
    unpacked ``lb-mini``: at most that many samples, the cap is not applied); packed
    ``lb-mini`` always packs by tokens. ``min_microbatches``
    (a pipeline needs at least pp) splits microbatches further where samples allow
    (``lb-mini``, token-capped ``balanced`` and token-capped packed ``none``).
    ``cost_model`` (default tokens) weighs samples when replicas are balanced (and, packed,
    ``lb-mini``'s microbatches). ``packed``: microbatches become packed rows (see the
    module docstring). ``segment_attention``: packed rows attend per document (the
    varlen / flex kernels on CUDA), so a row costs the sum of its samples' costs;
    otherwise (the dense kernel on CPU) the cost of its whole length.
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
    elif mode == "lb-mini" and not packed:
        microbatches = _lb_mini_padded(array, num_replicas, max_tokens, cost_model,
                                       samples_per_microbatch, min_microbatches)
    elif mode == "lb-mini":
        microbatches = _lb_mini_packed(array, num_replicas, max_tokens, cost_model,
                                       samples_per_microbatch, min_microbatches,
                                       segment_attention)
    else:
        microbatches = _balanced(array, num_replicas, max_tokens, cost_model,
                                 samples_per_microbatch, min_microbatches, packed)
    return MinibatchPlan(microbatches=microbatches,
                         costs=replica_costs(microbatches, array, cost_model, packed=packed,
                                             segments=segment_attention))


def _lb_mini_packed(lengths: np.ndarray, num_replicas: int, max_tokens: int,
                    cost_model: SampleCostModel | None, samples_per_microbatch: int | None,
                    min_microbatches: int, segments: bool) -> list[list[list[int]]]:
    """Packed lb-mini: replicas balanced by cost (any sample counts), each packed into
    rows by what the rows cost as executed. ``balanced``'s packed plan under the same
    flags is a candidate too (the smaller largest replica cost, then total, wins; ties
    keep lb-mini's own), so lb-mini is never costlier than balanced."""
    own = []
    for indices in balance_minibatch(lengths, num_replicas, cost_model):
        groups = pack_microbatches(indices, lengths, max_tokens, cost_model or TokenCost(),
                                   row_cost=True, segments=segments)
        groups = _split_until(groups, min_microbatches, lengths)
        own.append([sorted(group) for group in groups])
    candidates = [own]
    try:
        candidates.append(_balanced(lengths, num_replicas, max_tokens, cost_model,
                                    samples_per_microbatch, min_microbatches, True))
    except ValueError:  # uneven counts or a cap balanced cannot meet: not a candidate
        pass

    def score(plan: list[list[list[int]]]) -> tuple[float, float]:
        costs = replica_costs(plan, lengths, cost_model, packed=True, segments=segments)
        return max(costs), sum(costs)

    return min(candidates, key=score)


def _lb_mini_padded(lengths: np.ndarray, num_replicas: int, max_tokens: int,
                    cost_model: SampleCostModel | None, samples_per_microbatch: int | None,
                    min_microbatches: int) -> list[list[list[int]]]:
    """Unpacked lb-mini: padded microbatches, replicas balanced by their padded cost.
    Candidates, the smaller largest replica cost (then total) wins: (a) samples balanced
    over replicas (any counts), refined by padded cost, then each replica grouped longest
    first; (b) all samples grouped longest first, then the groups balanced over replicas;
    (c) equal-count replicas refined the same way; (d) ``balanced``'s own plan, so
    lb-mini is never costlier than balanced."""
    grouping = (dict(samples_per_microbatch=samples_per_microbatch)
                if samples_per_microbatch is not None else dict(max_tokens=max_tokens))
    if samples_per_microbatch is None:
        _check_singles(lengths, max_tokens)

    def finish(replicas: list[list[list[int]]]) -> list[list[list[int]]]:
        return [sorted((sorted(g) for g in _split_until(groups, min_microbatches, lengths)),
                       key=lambda g: (-microbatch_cost(g, lengths, cost_model), g))
                for groups in replicas]

    replicas = _refine_padded(balance_minibatch(lengths, num_replicas, cost_model), lengths,
                              cost_model, grouping)
    by_samples = finish([pack_padded(indices, lengths, **grouping) for indices in replicas])
    groups = pack_padded(range(len(lengths)), lengths, **grouping)
    parts = balance_costs([microbatch_cost(g, lengths, cost_model) for g in groups],
                          num_replicas)
    by_groups = finish([[groups[i] for i in part] for part in parts])

    def score(plan: list[list[list[int]]]) -> tuple[float, float]:
        costs = replica_costs(plan, lengths, cost_model)
        return max(costs), sum(costs)

    candidates = [by_samples] + ([by_groups] if all(by_groups) or not all(by_samples) else [])
    if len(lengths) >= num_replicas:  # equal counts are a valid lb-mini plan too
        replicas = _refine_padded(balance_equal_counts(lengths, num_replicas, cost_model),
                                  lengths, cost_model, grouping)
        candidates.append(finish([pack_padded(r, lengths, **grouping) for r in replicas]))
        try:
            candidates.append(finish(_balanced(lengths, num_replicas, max_tokens, cost_model,
                                               samples_per_microbatch, 1, False)))
        except ValueError:  # uneven counts or a cap balanced cannot meet: not a candidate
            pass
    return min(candidates, key=score)


def _refine_padded(replicas: list[list[int]], lengths: np.ndarray,
                   cost_model: SampleCostModel | None, grouping: dict,
                   max_rounds: int = 64) -> list[list[int]]:
    """Move single samples from the costliest replica to the cheapest while that lowers
    the larger of their padded costs (grouped by ``grouping``); bounded, deterministic."""
    replicas = [list(r) for r in replicas]

    def cost(indices: list[int]) -> float:
        return sum(microbatch_cost(g, lengths, cost_model)
                   for g in pack_padded(indices, lengths, **grouping))

    costs = [cost(r) for r in replicas]
    for _ in range(max_rounds):
        high = max(range(len(replicas)), key=lambda r: (costs[r], -r))
        low = min(range(len(replicas)), key=lambda r: (costs[r], r))
        if high == low or len(replicas[high]) < 2:
            break
        best = None
        for item in sorted(replicas[high]):
            new_high = cost([i for i in replicas[high] if i != item])
            new_low = cost(replicas[low] + [item])
            if max(new_high, new_low) < costs[high] - 1e-12 * costs[high] and (
                    best is None or max(new_high, new_low) < best[0]):
                best = (max(new_high, new_low), item, new_high, new_low)
        if best is None:
            break
        _, item, costs[high], costs[low] = best
        replicas[high].remove(item)
        replicas[low].append(item)
    return [sorted(r) for r in replicas]


def _check_singles(lengths: np.ndarray, max_tokens: int) -> None:
    too_long = [i for i in range(len(lengths)) if lengths[i] > max_tokens]
    if too_long:
        raise ValueError(f"sample {too_long[0]} has {int(lengths[too_long[0]])} tokens, more "
                         f"than max_tokens={max_tokens}; raise max_tokens or truncate the sample")


def _strided(lengths: np.ndarray, num_replicas: int, max_tokens: int,
             samples_per_microbatch: int | None, packed: bool) -> list[list[list[int]]]:
    if samples_per_microbatch is None:
        from .samples import split_by_tokens  # imports torch: flag checks use this module
        positions = list(range(len(lengths)))
        return [split_by_tokens(positions[r::num_replicas],
                                [int(v) for v in lengths[r::num_replicas]], max_tokens,
                                packed=packed)
                for r in range(num_replicas)]
    microbatches = equal_count_balance(lengths, num_replicas, samples_per_microbatch)
    _check_cap(microbatches, lengths, max_tokens, "equal-count", packed)
    return microbatches


def _balanced(lengths: np.ndarray, num_replicas: int, max_tokens: int,
              cost_model: SampleCostModel | None, samples_per_microbatch: int | None,
              min_microbatches: int, packed: bool) -> list[list[list[int]]]:
    """Cost-balanced replicas of equal sample count, each cut into the same number of
    microbatches: padded, of similar lengths (least padding); packed, token-balanced."""
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
        microbatches = [_split_replica(lengths, indices, counts, packed=packed)
                        for indices in replicas]
        _check_cap(microbatches, lengths, max_tokens, "balanced", packed)
        return microbatches
    fewest = min(len(indices) for indices in replicas)
    needed = [len(pack_microbatches(indices, lengths, max_tokens)) if packed else
              len(pack_padded(indices, lengths, max_tokens=max(max_tokens, int(lengths.max()))))
              for indices in replicas]
    count = max(max(needed), min(min_microbatches, fewest))
    while count <= fewest:
        microbatches = [_split_replica(lengths, indices, None, count, packed=packed)
                        for indices in replicas]
        if all(_size(mb, lengths, packed) <= max_tokens for replica in microbatches
               for mb in replica):
            return microbatches
        count += 1
    raise ValueError(f"balanced: cannot cut every replica into the same number of "
                     f"microbatches of at most max_tokens={max_tokens} tokens (replicas hold "
                     f"{fewest}..{max(len(r) for r in replicas)} samples); raise max_tokens "
                     f"or make the global minibatch a multiple of {num_replicas}")


def _size(group: list[int], lengths: np.ndarray, packed: bool) -> int:
    """Tokens the runtime runs for ``group``: the packed row, or count x longest."""
    return int(lengths[group].sum()) if packed else len(group) * int(lengths[group].max())


def _split_replica(lengths: np.ndarray, indices: list[int], counts: list[int] | None,
                   num_microbatches: int | None = None, *,
                   packed: bool = True) -> list[list[int]]:
    """A replica's samples in microbatches of sizes ``counts``, or ``num_microbatches``
    non-empty ones of near-equal size; largest microbatch first. Packed: token-balanced.
    Padded: consecutive runs of the longest-first order (similar lengths, least padding),
    sizes ascending so the long samples share the smaller microbatches."""
    if not packed:
        if counts is None:
            base, extra = divmod(len(indices), num_microbatches)
            counts = [base] * (num_microbatches - extra) + [base + 1] * extra
        order = sorted(indices, key=lambda i: (-int(lengths[i]), i))
        groups, position = [], 0
        for size in sorted(counts):
            groups.append(sorted(order[position:position + size]))
            position += size
        groups = [g for g in groups if g]
        return sorted(groups, key=lambda g: (-_size(g, lengths, False), g))
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
               what: str, packed: bool) -> None:
    for replica in microbatches:
        for mb in replica:
            if _size(mb, lengths, packed) > max_tokens:
                shape = "tokens" if packed else "padded tokens (count x longest)"
                raise ValueError(f"{what} microbatch {mb} has {_size(mb, lengths, packed)} "
                                 f"{shape} > max_tokens={max_tokens}; lower "
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
