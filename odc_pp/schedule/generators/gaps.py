"""Gap filling: move weight-gradient work (W) later, into the idle gaps of a schedule.

A W has no consumer inside the minibatch: running it later delays nothing but the actions
it passes, which then start sooner by its duration. So where a rank idles before an action
that waits for a peer, a W run earlier on that rank can fill the gap; and where a producer
(the F or B a peer waits for) ran late because W's preceded it, those W's can go after it.
Both hold memory longer (a W frees what its B left, ``-mem_w``), so each move is taken only
if every rank stays within the memory limit.

This is a deterministic first-improvement descent under the simulator: candidate moves
are derived from the current schedule's gaps (largest first), each scored by
``simulate`` on the schedule with its communication lowered; the first that shortens
the makespan without raising the worst per-rank bubble is taken, and the descent
restarts from it, until no move improves or ``max_evaluations`` candidates were scored
(at pp=2, 8 microbatches: about 2,000 for interleaved 1F1B). Fused BW actions are
split into B then W first (the same arithmetic). A W never passes another W of its own
chunk, so each chunk's weight gradients still accumulate in the order the generator gave
them.

Under uniform costs the zero-bubble patterns (ZB-H1, ZB-V) leave no gap a W can fill.
Under measured costs (unequal stages, B longer than F, W short, and the measured share of
a microbatch's activations that its W holds) the fixed patterns do: at the CPU
benchmark's seq-2048 shape (pp=2, 8 microbatches) interleaved 1F1B simulates at 7.57 s
and 7.33 s filled, with the same peak; ZB-V's cost-aware plan stays at 7.41 s, held by
its memory cap (the handcrafted pattern: 7.45 s).
"""

from __future__ import annotations

from ..costs import CostModel
from ..ir import Action, ActionKind, Schedule
from ..lowering import lower_communication
from ..simulator import SimResult, simulate

__all__ = ["fill_gaps", "split_fused", "DEFAULT_FILL_EVALUATIONS"]

DEFAULT_FILL_EVALUATIONS = 3000
"""Candidate moves scored by default, each one simulation (pp=2, 8 microbatches: about
1 ms each on this CPU)."""

_TOL = 1e-9
_CANDIDATES_PER_GAP = 4
"""Longest block of one chunk's W's moved at once (its last W's before the gap)."""


def split_fused(schedule: Schedule) -> list[list[Action]]:
    """Each rank's actions with every BW written as B then W (the same arithmetic)."""
    out = []
    for actions in schedule.ranks:
        rank = []
        for a in actions:
            if a.kind is ActionKind.BW:
                rank.append(Action(rank=a.rank, kind=ActionKind.B, chunk=a.chunk,
                                   microbatch=a.microbatch))
                rank.append(Action(rank=a.rank, kind=ActionKind.W, chunk=a.chunk,
                                   microbatch=a.microbatch))
            else:
                rank.append(a)
        out.append(rank)
    return out


def _simulate(schedule: Schedule, ranks: list[list[Action]], costs: CostModel,
              memory_limit: float | None = None) -> SimResult:
    """``ranks`` simulated with the communication the runtime runs (each message's CPU
    cost on the sender, its latency): a compute-only schedule hides those."""
    return simulate(lower_communication(schedule.copy(ranks=ranks)), costs,
                    memory_limit=memory_limit)


def _key(schedule: Schedule, ranks: list[list[Action]], costs: CostModel,
         memory_limit: float) -> tuple[float, float] | None:
    """(makespan, worst per-rank bubble) of ``ranks``, or None past ``memory_limit``."""
    result = _simulate(schedule, ranks, costs, memory_limit)
    if not result.fits_memory:
        return None
    return result.makespan, max(s - b for s, b in zip(result.span, result.busy))


def _producers(schedule: Schedule, ranks: list[list[Action]]) -> dict:
    """(F or B, stage, microbatch) -> (rank, position) of every F and B/BW."""
    where = {}
    for r, actions in enumerate(ranks):
        for i, a in enumerate(actions):
            if a.kind in (ActionKind.F, ActionKind.B, ActionKind.BW):
                kind = ActionKind.F if a.kind is ActionKind.F else ActionKind.B
                where[(kind, schedule.stage_of(r, a.chunk), a.microbatch)] = (r, i)
    return where


def _w_blocks(actions: list[Action], before: int) -> list[tuple[int, ...]]:
    """Blocks of W's that can move, in their order, to just before position ``before``:
    per chunk, its last 1, 2, ... ``_CANDIDATES_PER_GAP`` W's before it (every W of that
    chunk in between moves too, so per-chunk W order is kept)."""
    latest: dict[int, list[int]] = {}
    for j in range(before - 1, -1, -1):
        a = actions[j]
        if a.kind is ActionKind.W and len(latest.setdefault(a.chunk, [])) < \
                _CANDIDATES_PER_GAP:
            latest[a.chunk].append(j)
    blocks = []
    for chunk in sorted(latest):
        positions = latest[chunk]
        blocks += [tuple(sorted(positions[:n])) for n in range(1, len(positions) + 1)]
    return sorted(blocks, key=lambda block: (len(block), -block[-1]))


def _moved(actions: list[Action], block: tuple[int, ...], before: int) -> list[Action]:
    """``actions`` with the W's at ``block`` (all before ``before``) moved, in order, to
    just before position ``before``."""
    taken = set(block)
    rest = [a for j, a in enumerate(actions) if j not in taken]
    at = before - len(block)
    return rest[:at] + [actions[j] for j in block] + rest[at:]


def _moves(schedule: Schedule, ranks: list[list[Action]], costs: CostModel):
    """Candidate (rank, block, before) moves, largest gap first: W's into the gap before a
    waiting action, or W's from before the producer it waits for to just after it."""
    result = _simulate(schedule, ranks, costs)
    gaps = []
    for r, lowered in enumerate(result.rank_actions):
        i, sends, previous_end = -1, 0, None
        for action, began, ended in zip(lowered, result.rank_starts[r], result.rank_ends[r]):
            if action.kind in (ActionKind.SEND_F, ActionKind.SEND_B):
                sends += 1
            if not action.is_compute:
                continue
            i += 1
            if previous_end is not None:  # idle: not computing, not sending
                idle = began - previous_end - sends * costs.t_send_cpu
                if idle > _TOL:
                    gaps.append((-idle, r, i))
            sends, previous_end = 0, ended
    where = _producers(schedule, ranks)
    stages = schedule.num_stages
    for _, r, i in sorted(gaps):
        actions = ranks[r]
        for block in _w_blocks(actions, i):
            yield r, block, i
        waiting = actions[i]
        stage = schedule.stage_of(r, waiting.chunk)
        if waiting.kind is ActionKind.F and stage > 0:
            producer = where.get((ActionKind.F, stage - 1, waiting.microbatch))
        elif waiting.kind in (ActionKind.B, ActionKind.BW) and stage < stages - 1:
            producer = where.get((ActionKind.B, stage + 1, waiting.microbatch))
        else:
            producer = None
        if producer is not None and producer[0] != r:
            q, k = producer
            for block in _w_blocks(ranks[q], k):
                yield q, block, k + 1


def fill_gaps(schedule: Schedule, costs: CostModel, *, memory_limit: float,
              max_evaluations: int = DEFAULT_FILL_EVALUATIONS) -> Schedule:
    """``schedule`` (compute only) with W's moved into its gaps (module docstring): never
    a longer makespan nor a larger worst bubble under ``costs``, every rank within
    ``memory_limit``. ``meta["gap_fill"]`` records the moves taken, the candidates scored
    and the makespan before and after. A pure function of its arguments."""
    if not isinstance(max_evaluations, int) or max_evaluations < 0:
        raise ValueError(f"max_evaluations must be an integer >= 0, got {max_evaluations!r}")
    ranks = split_fused(schedule)
    best = _key(schedule, ranks, costs, memory_limit)
    if best is None:
        raise ValueError(f"{schedule.name}: its peak exceeds memory_limit {memory_limit:g} "
                         "before any gap is filled")
    before, left, taken = best[0], max_evaluations, 0
    improved = True
    while improved and left > 0:
        improved = False
        for r, block, at in _moves(schedule, ranks, costs):
            if left == 0:
                break
            left -= 1
            trial = ranks[:r] + [_moved(ranks[r], block, at)] + ranks[r + 1:]
            key = _key(schedule, trial, costs, memory_limit)
            if key is not None and key[0] < best[0] - _TOL and key[1] <= best[1] + _TOL:
                ranks, best, taken, improved = trial, key, taken + 1, True
                break
    meta = dict(schedule.meta, gap_fill={"moves": taken,
                                         "evaluations": max_evaluations - left,
                                         "makespan_before": before, "makespan": best[0]})
    return schedule.copy(ranks=ranks, meta=meta)
