"""Pairwise refinement of a split into parts: moves and swaps between two parts, each
strictly lowering the larger load of the pair (the last step of every balancer in
:mod:`odc_pp.data.load_balance`)."""

from __future__ import annotations

import numpy as np

__all__ = ["refine"]


def refine(subsets: list[list[int]], costs: np.ndarray, max_rounds: int = 1000, *,
            moves: bool = True) -> None:
    """Pairwise moves and swaps (swaps only with ``moves=False``, which keeps every part's
    sample count), each strictly lowering the larger load of the pair.

    Every accepted step makes the descending-sorted load vector lexicographically smaller,
    so this terminates; ``max_rounds`` only bounds the work on large inputs.
    """
    loads = [float(costs[s].sum()) if s else 0.0 for s in subsets]
    tolerance = 1e-12 * max(1.0, float(costs.sum()))
    versions = [0] * len(subsets)  # bumped when a part changes
    failed: set[tuple[int, int, int, int]] = set()  # pairs with no exchange, by version
    for _ in range(max_rounds):
        order = sorted(range(len(subsets)), key=lambda r: -loads[r])
        if not _improve_any(subsets, loads, costs, order, tolerance, moves, versions,
                            failed):
            return


def _improve_any(subsets, loads, costs, order, tolerance, moves, versions, failed) -> bool:
    """Apply the first improving exchange in ``order``'s pair order. A pair with no
    exchange stays without one until either part changes, so it is not searched again
    (``failed``, keyed by both parts' versions): the result is that of the full scan."""
    for position, high in enumerate(order):
        for low in reversed(order[position + 1:]):
            gap = loads[high] - loads[low]
            if gap <= tolerance:
                continue
            pair = (high, versions[high], low, versions[low])
            if pair in failed:
                continue
            if _best_exchange(subsets, loads, costs, high, low, gap, tolerance, moves):
                versions[high] += 1
                versions[low] += 1
                return True
            failed.add(pair)
    return False


def _best_exchange(subsets, loads, costs, high, low, gap, tolerance, moves) -> bool:
    """Apply the move/swap between ``high`` and ``low`` whose transfer is closest to gap/2
    (the first such in ``high``'s order, then ``low``'s with the move first)."""
    low_items = ([None] if moves else []) + subsets[low]
    if len(subsets[high]) * len(low_items) >= _VECTOR_PAIRS:
        best_delta, best_pair = _best_pair_vectorised(subsets[high], low_items, costs, gap,
                                                      tolerance)
    else:
        best_delta, best_pair = 0.0, None
        for out_item in subsets[high]:
            for in_item in low_items:
                delta = float(costs[out_item]) - (0.0 if in_item is None
                                                  else float(costs[in_item]))
                # New larger load is max(high - delta, low + delta) < high iff
                # 0 < delta < gap.
                if tolerance < delta < gap - tolerance and \
                        abs(gap / 2 - delta) < abs(gap / 2 - best_delta):
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


_VECTOR_PAIRS = 48
"""Pairs from which ``_best_exchange`` searches with numpy (the same choice as the loop)."""


def _best_pair_vectorised(high_items, low_items, costs, gap, tolerance):
    out_costs = costs[high_items]
    in_costs = np.array([0.0 if item is None else costs[item] for item in low_items])
    delta = out_costs[:, None] - in_costs[None, :]
    distance = np.abs(gap / 2 - delta)
    valid = (delta > tolerance) & (delta < gap - tolerance) & (distance < gap / 2)
    if not valid.any():
        return 0.0, None
    index = int(np.argmin(np.where(valid, distance, np.inf)))
    row, column = divmod(index, len(low_items))
    return float(delta[row, column]), (high_items[row], low_items[column])
