"""Repeating building blocks for V-shape schedules ("controllable memory" construction).

A building block is the placement, in unit time slots, of every compute action of one
microbatch on every rank. Microbatch ``j`` uses the block shifted by ``j * interval``.
If, on each rank, the block's actions fall into distinct residues modulo ``interval``,
shifted copies never collide, so the union is a feasible timed schedule; its per-rank
time order is the schedule. The peak activation memory of a rank is about the summed
lifespans of its activations (F to the action that frees them) divided by the interval,
so a longer interval (more idle time per microbatch) buys less memory: the generator
picks the shortest interval whose peak fits the memory cap.

The block is built greedily along the microbatch's dependency chain: each action goes to
the earliest slot after its dependency whose residue is still free on its rank; each W
goes to the earliest free slot after its B (W is what frees memory under the default
deltas, so it is kept close to its B).
"""

from __future__ import annotations

from ..costs import CostModel
from ..ir import Action, ActionKind
from ..placement import Placement, locate, num_stages

__all__ = ["v_block_orders", "v_block_peak"]


def _place(used: set[int], earliest: int, interval: int) -> int:
    slot = earliest
    while slot % interval in used:
        slot += 1
    used.add(slot % interval)
    return slot


def _v_block(pp: int, interval: int) -> list[tuple[int, int, ActionKind, int]]:
    """(slot, rank, kind, chunk) of one microbatch's actions, V placement, 2 chunks."""
    stages = num_stages(pp, 2)
    used: list[set[int]] = [set() for _ in range(pp)]
    placed: list[tuple[int, int, ActionKind, int]] = []
    ready = 0
    for stage in range(stages):
        rank, chunk = locate(Placement.V, pp, 2, stage)
        slot = _place(used[rank], ready, interval)
        placed.append((slot, rank, ActionKind.F, chunk))
        ready = slot + 1
    backward: list[tuple[int, int, int]] = []
    for stage in reversed(range(stages)):
        rank, chunk = locate(Placement.V, pp, 2, stage)
        slot = _place(used[rank], ready, interval)
        placed.append((slot, rank, ActionKind.B, chunk))
        backward.append((slot, rank, chunk))
        ready = slot + 1
    for slot, rank, chunk in backward:
        placed.append((_place(used[rank], slot + 1, interval), rank, ActionKind.W, chunk))
    return placed


def v_block_orders(pp: int, num_microbatches: int, interval: int) -> list[list[Action]]:
    """Per-rank action orders of the V building block repeated every ``interval`` slots."""
    if interval < 6:
        raise ValueError(f"a V building block needs an interval of at least 6 slots "
                         f"(F, B, W on two chunks), got {interval}")
    block = _v_block(pp, interval)
    timed: list[list[tuple[int, int, Action]]] = [[] for _ in range(pp)]
    for mb in range(num_microbatches):
        for slot, rank, kind, chunk in block:
            timed[rank].append((slot + mb * interval, mb,
                                Action(rank=rank, kind=kind, chunk=chunk, microbatch=mb)))
    return [[action for _, _, action in sorted(items)] for items in timed]


def v_block_peak(pp: int, num_microbatches: int, interval: int,
                 costs: CostModel) -> list[float]:
    """Per-rank peak of the running sum of activation deltas along
    ``v_block_orders(pp, num_microbatches, interval)``,
    computed from the block alone (no orders built).

    On a rank every copy of every block action has its own time (distinct residues), and
    right after copy ``j`` of action ``a`` the rank holds, of each block action ``b``,
    ``clamp(j + d_ab, 0, m)`` copies with ``d_ab = floor((slot_a - slot_b) / interval) + 1``.
    Where no clamp is active that sum is linear in ``j``, so only the copies near both
    ends of the run, and the ends of the linear range, need evaluating.
    """
    if interval < 6:
        raise ValueError(f"a V building block needs an interval of at least 6 slots "
                         f"(F, B, W on two chunks), got {interval}")
    m = num_microbatches
    per_rank: list[list[tuple[int, float]]] = [[] for _ in range(pp)]
    for slot, rank, kind, _ in _v_block(pp, interval):
        per_rank[rank].append((slot, costs.memory_delta(kind)))
    peaks = []
    for actions in per_rank:
        peak = 0.0
        for slot_a, _ in actions:
            offsets = [((slot_a - slot_b) // interval + 1, delta) for slot_b, delta in actions]
            low = max(0, -min(d for d, _ in offsets))  # from here no count clamps at 0
            high = min(m - 1, m - max(d for d, _ in offsets))  # up to here none at m
            copies = set(range(0, min(low, m - 1) + 1)) | set(range(max(high, 0), m))
            for j in copies:
                memory = sum(delta * min(max(j + d, 0), m) for d, delta in offsets)
                peak = max(peak, memory)
        peaks.append(peak)
    return peaks
