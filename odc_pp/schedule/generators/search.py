"""ZB-auto: search a 1-chunk F/B/W schedule for the given per-stage costs and memory limit.

The objective (``odc_pp.schedule.simulator.OBJECTIVES``) is the steady-state iteration
time: by default the longest per-stage span (first compute start to last compute end on a
rank), which is what an iteration costs when optimizer post-validation lets iterations
overlap; ``objective="makespan"`` serves runs that synchronise before the optimizer step.
Every candidate is scored by the simulator (``simulator.score``, which stops early once a
candidate cannot beat the incumbent); the search has no clock of its own.

Candidates, in this order:

1. **Hand-built orders** from the generators: 1F1B (fused BW split into B then W), ZB-H1
   and ZB-H2 (its in-flight limit lowered to the memory limit), so the result is never
   worse than them when they fit.
2. **List scheduling** (``_engine``, the one list scheduler): a free rank runs a ready B,
   else a ready F if the rank holds fewer than ``inflight[rank]`` microbatches between F
   and B and the activation fits, else a pending W when it ends before the next input
   can arrive plus a slack (or memory forces it). Several warm-up depth families and
   slack values are tried.
3. **Coordinate descent** over the per-rank warm-up depths of the best list schedule.
4. **Local search**: one W moved a few places on a rank (a seeded random walk, so the
   same input always gives the same schedule).

The search is bounded by a number of candidate evaluations (``max_evaluations``, default
scaled to the problem size), never by time: every rank of a job computes the same
schedule (``Schedule.digest`` lets them check). It stops early when a candidate reaches
the objective's lower bound (``stage_span_lower_bound`` / ``makespan_lower_bound``).

Default memory limit: ``2 * pp`` microbatch activations (``2 * pp * costs.mem_f``),
twice what 1F1B needs on its first rank; this is the regime where zero bubble is
attainable. Pass ``memory_limit=pp * costs.mem_f`` for the 1F1B budget.
"""

from __future__ import annotations

import math
import random
import time

from ..costs import CostModel
from ..ir import Action, ActionKind, Placement, Schedule
from ..simulator import OBJECTIVES, score, simulate
from ._engine import EngineConfig, EngineStalled, run_engine
from .classic import one_f_one_b, zb_h1, zb_h2
from .gaps import split_fused

__all__ = ["zb_auto", "makespan_lower_bound", "stage_span_lower_bound",
           "bubble_lower_bound", "default_memory_limit", "default_max_evaluations"]

_INF = float("inf")
_TOL = 1e-9


def default_memory_limit(pp: int, costs: CostModel) -> float:
    """``2 * pp`` microbatch activations per rank (see the module docstring)."""
    return 2.0 * pp * max(costs.mem_f, 1e-12)


def default_max_evaluations(pp: int, num_microbatches: int) -> int:
    """Candidate evaluations when none are given: about 300k simulated actions in all,
    at least 12 and at most 400 candidates."""
    return max(12, min(400, 300_000 // (3 * pp * num_microbatches)))


def _per_rank(costs: CostModel, pp: int, kind: ActionKind) -> list[float]:
    return [costs.compute_time(kind, stage=r, rank=r, pp=pp, num_stages=pp)
            for r in range(pp)]


def _memory_counts(limit: float | None, costs: CostModel, m: int) -> tuple[int, float]:
    """(most forwards a rank can hold before its first B, the limit as a float)."""
    if limit is None or math.isinf(limit) or costs.mem_f <= 0:
        return m, _INF
    return min(m, int(limit / costs.mem_f + _TOL)), float(limit)


# ----- lower bounds -----------------------------------------------------------------
def _check_shape(pp: int, num_microbatches: int) -> None:
    if pp < 1 or num_microbatches < 1:
        raise ValueError(f"need pp >= 1 and num_microbatches >= 1, got pp={pp}, "
                         f"num_microbatches={num_microbatches}")


def makespan_lower_bound(pp: int, num_microbatches: int, costs: CostModel,
                         memory_limit: float | None = None) -> float:
    """A lower bound on the makespan of any 1-chunk F/B/W schedule.

    For every rank r (stage r), with m microbatches, per-stage times F_s, B_s, W_s and
    transfer latency c, the rank's timeline splits at its first B and its last B:

    * before the first B it can only run forwards: the first one cannot start before
      ``a_r = sum_{s<r} F_s + r*c`` and the first B cannot start before the first
      microbatch went down and its gradient came back,
      ``b_r = sum_s F_s + sum_{s>r} B_s + (2*pp - 2 - r)*c``; at most ``K_f`` forwards
      fit in memory before it, so the forwards end no earlier than
      ``max(a_r + m*F_r, b_r + (m - K_f)*F_r)``;
    * every B then runs, and all but the ``K_w`` deferred W (memory holds at most K_w
      microbatches between B and W);
    * after the last B the rank runs at least its deferred W, while the gradient still
      has to travel down to rank 0 and be followed by rank 0's W:
      ``max(m*W_r, (m - K_w)*W_r + sum_{s<r} (B_s + c) + W_0)``.

    Without a memory limit ``K_f = K_w = m``. The bound is the maximum over ranks.
    """
    _check_shape(pp, num_microbatches)
    m, c = num_microbatches, float(costs.t_comm)
    f, b, w = (_per_rank(costs, pp, k) for k in (ActionKind.F, ActionKind.B, ActionKind.W))
    k_f, limit = _memory_counts(memory_limit, costs, m)
    held_after_b = costs.mem_f + costs.mem_b
    k_w = m if held_after_b <= 0 or math.isinf(limit) else max(
        1, min(m, int(limit / held_after_b + _TOL)))
    total_f = sum(f)
    terms = []
    for r in range(pp):
        arrive = sum(f[:r]) + r * c
        first_b = total_f + (pp - 1) * c + sum(b[r + 1:]) + (pp - 1 - r) * c
        head = max(arrive + m * f[r], first_b + (m - k_f) * f[r])
        chain = sum(b[:r]) + r * c + w[0]
        tail = max(m * w[r], (m - k_w) * w[r] + chain)
        terms.append(head + m * b[r] + tail)
    return max(terms)


def _tail_work(m: int, costs: CostModel, limit: float, t_b: float, t_w: float) -> float:
    """Most B/W work of other microbatches a rank can hold when its last F starts."""
    if math.isinf(limit):
        return (m - 1) * (t_b + t_w)
    held_b = costs.mem_f + costs.mem_b  # a microbatch between B and W
    best = 0.0
    for x in range(m):  # x microbatches between F and B besides the last one
        room = limit - (x + 1) * costs.mem_f
        if room < -_TOL:
            break
        y = m - 1 - x if held_b <= 0 else min(m - 1 - x, int(room / held_b + _TOL))
        best = max(best, x * (t_b + t_w) + y * t_w)
    return best


def stage_span_lower_bound(pp: int, num_microbatches: int, costs: CostModel,
                           memory_limit: float | None = None) -> float:
    """A lower bound on the longest per-rank span of any 1-chunk F/B/W schedule.

    Rank r's span is its busy time ``m (F_r + B_r + W_r)`` plus its idle time, and two
    windows of the span force idle time:

    * **head**: from its first F to its first B the rank can only run forwards, at most
      ``K_f = min(m, limit // mem_f)`` of them, while the first B cannot start before a
      microbatch went down and its gradient came back,
      ``R_r = sum_{s>=r} F_s + sum_{s>r} B_s + 2 (pp - 1 - r) c``; idle
      ``>= R_r - K_f F_r``;
    * **tail**: from the end of its last F to the B of that microbatch the gradient needs
      ``R_r - F_r``; the rank can fill it only with the B and W of microbatches it holds
      when that F starts (x between F and B, y between B and W, with
      ``(x + 1) mem_f + y (mem_f + mem_b) <= limit`` and ``x + y <= m - 1``), at most
      ``max (x (B_r + W_r) + y W_r)``; idle ``>=`` the rest.

    When ``m > K_f`` some F runs after the first B, so the windows are disjoint and the
    idle times add; otherwise the larger one counts.

    A third term follows the last microbatch through the last stage: every F of the last
    rank precedes its last B, and when that B starts at most ``y`` W passes can be
    pending there (``mem_f + y (mem_f + mem_b) <= limit``), so at least
    ``n_w = m - 1 - y`` W run before it. Rank r's first F starts the chain, so its span
    is at least ``sum_{r<=s<p-1} (F_s + B_s + 2c) + m (F_{p-1} + B_{p-1}) +
    n_w W_{p-1} + W_r``. (With the paper's memory model W is cheap to defer and
    ``n_w`` is 0; with B holding everything until W it can dominate.)
    The bound is the largest rank's.
    At equal costs, no latency and the default ``2 pp`` limit it is the busy time: zero
    bubble is attainable (ZB-H2 reaches it for m >= 2 pp).
    """
    _check_shape(pp, num_microbatches)
    m, c = num_microbatches, float(costs.t_comm)
    f, b, w = (_per_rank(costs, pp, k) for k in (ActionKind.F, ActionKind.B, ActionKind.W))
    k_f, limit = _memory_counts(memory_limit, costs, m)
    terms = []
    for r in range(pp):
        round_trip = sum(f[r:]) + sum(b[r + 1:]) + 2 * (pp - 1 - r) * c
        head = max(0.0, round_trip - k_f * f[r])
        tail = max(0.0, round_trip - f[r] - _tail_work(m, costs, limit, b[r], w[r]))
        idle = head + tail if m > k_f else max(head, tail)
        chain = (sum(f[r:pp - 1]) + sum(b[r:pp - 1]) + 2 * (pp - 1 - r) * c +
                 m * (f[-1] + b[-1]) + _forced_w(m, costs, limit) * w[-1] + w[r])
        terms.append(max(m * (f[r] + b[r] + w[r]) + idle, chain))
    return max(terms)


def _forced_w(m: int, costs: CostModel, limit: float) -> int:
    """W passes the last rank must run before its last B (see stage_span_lower_bound)."""
    held = costs.mem_f + costs.mem_b
    if math.isinf(limit) or held <= 0:
        return 0
    pending = max(0, int((limit - costs.mem_f) / held + _TOL))
    return max(0, m - 1 - pending)


def bubble_lower_bound(pp: int, num_microbatches: int, costs: CostModel,
                       memory_limit: float | None = None, *,
                       objective: str = "span") -> float:
    """``(LB - busy_max) / LB``: the smallest bubble any schedule can reach, with LB the
    objective's lower bound (``stage_span_lower_bound``: the simulator's ``bubble_rate``;
    ``makespan_lower_bound``: the makespan-normalised bubble)."""
    bound = _bound(pp, num_microbatches, costs, memory_limit, objective)
    busiest = max(num_microbatches * sum(t) for t in zip(
        *(_per_rank(costs, pp, k) for k in (ActionKind.F, ActionKind.B, ActionKind.W))))
    return (bound - busiest) / bound if bound > 0 else 0.0


def _bound(pp, num_microbatches, costs, memory_limit, objective) -> float:
    if objective == "makespan":
        return makespan_lower_bound(pp, num_microbatches, costs, memory_limit)
    return stage_span_lower_bound(pp, num_microbatches, costs, memory_limit)


# ----- candidates -------------------------------------------------------------------
def _hand_built(pp: int, m: int, costs: CostModel, limit: float) -> list[tuple[str, list]]:
    inflight = max(1, min(2 * pp - 1, int(limit / costs.mem_f + _TOL)))
    return [("1f1b", split_fused(one_f_one_b(pp, m))), ("zb-h1", zb_h1(pp, m).ranks),
            ("zb-h2", zb_h2(pp, m, inflight=inflight).ranks)]


def _depth_families(pp: int, m: int, costs: CostModel) -> list[list[int]]:
    """Warm-up depth candidates: as many forwards as fit into the wait for the first B
    (round trip over F_r, rounded down and up), ZB-H2-like ``2 (pp - r) + k``, 1F1B-like
    ``pp - r + k``, round trip over the period, unlimited."""
    f, b, w = (_per_rank(costs, pp, k) for k in (ActionKind.F, ActionKind.B, ActionKind.W))
    c = costs.t_comm
    period = max(max(f[r] + b[r] + w[r] for r in range(pp)), 1e-12)
    trips = [sum(f[r:]) + sum(b[r + 1:]) + 2 * (pp - 1 - r) * c for r in range(pp)]
    families = [[max(1, min(m, rounding(trips[r] / max(f[r], 1e-12) - _TOL)))
                 for r in range(pp)] for rounding in (math.floor, math.ceil)]
    families += [[min(m, pp - r + extra) for r in range(pp)] for extra in (0, 1, 2)]
    families += [[max(1, min(m, 2 * (pp - r) + extra)) for r in range(pp)]
                 for extra in (-1, 0, 1)]
    for scale in (1.0, 1.5, 2.0, 3.0):
        families.append([max(1, min(m, math.ceil(scale * (sum(f[r:]) + sum(b[r + 1:]) +
                                                          2 * (pp - 1 - r) * c) / period)))
                         for r in range(pp)])
    families.append([m] * pp)
    unique = []
    for caps in families:
        if caps not in unique:
            unique.append(caps)
    return unique


class _Search:
    """Incumbent, evaluation budget and the objective's target (its lower bound)."""

    def __init__(self, pp: int, m: int, costs: CostModel, limit: float, objective: str,
                 budget: int, target: float) -> None:
        self.pp, self.m, self.costs, self.limit = pp, m, costs, limit
        self.objective, self.left, self.target = objective, budget, target
        self.best_value, self.best_ranks, self.source = _INF, None, ""
        self.evaluations = 0

    @property
    def done(self) -> bool:
        return self.left <= 0 or self.best_value <= self.target + _TOL

    def offer(self, ranks: list[list[Action]], source: str) -> bool:
        """Score ``ranks`` (one evaluation); keep it if strictly better."""
        if self.left <= 0:
            return False
        self.left -= 1
        self.evaluations += 1
        schedule = Schedule(name="zb-auto", pp=self.pp, num_microbatches=self.m,
                            ranks=ranks)
        value = score(schedule, self.costs, objective=self.objective,
                      memory_limit=self.limit, cutoff=self.best_value - _TOL)
        if value is None:
            return False
        self.best_value, self.best_ranks, self.source = value, ranks, source
        return True

    def list_schedule(self, inflight: list[int], w_slack: float | None,
                      yields: list[bool] | None = None) -> list | None:
        try:
            return run_engine(EngineConfig(
                pp=self.pp, num_microbatches=self.m, num_chunks=1,
                placement=Placement.INTERLEAVED, costs=self.costs,
                caps=[self.limit] * self.pp, reserve_slot=False, inflight=inflight,
                w_slack=w_slack, forward_yields=yields)).ranks
        except EngineStalled:
            return None


_SLACKS = (1.0, None, 0.0, 0.5)  # None: a W fills any idle moment


def _construct(search: _Search) -> tuple[list[int], float | None]:
    best = ([search.m] * search.pp, 0.0)
    for inflight in _depth_families(search.pp, search.m, search.costs):
        for w_slack in _SLACKS:
            if search.done:
                return best
            ranks = search.list_schedule(inflight, w_slack)
            if ranks is not None and search.offer(ranks, "list schedule"):
                best = (inflight, w_slack)
    return best


def _descend(search: _Search, inflight: list[int], w_slack: float | None) -> None:
    """Coordinate descent over per-rank warm-up depths."""
    improved = True
    while improved and not search.done:
        improved = False
        for r in range(search.pp):
            for step in (1, -1, 2, -2):
                if search.done:
                    return
                trial = list(inflight)
                trial[r] = max(1, min(search.m, trial[r] + step))
                if trial[r] == inflight[r]:
                    continue
                ranks = search.list_schedule(trial, w_slack)
                if ranks is not None and search.offer(ranks, "list schedule+depths"):
                    inflight, improved = trial, True
                    break


def _chain_moves(search: _Search) -> list[list[tuple[int, int, int]]]:
    """Candidate move sets (each a list of ``(rank, position, new position)``) that start a
    late action of the critical path sooner: for every idle gap of the rank with the
    longest value, follow the dependency chain that made the next action wait (B inputs
    from the next rank, F inputs from the previous one); wherever a producer waited for
    the action before it on its own rank, propose moving the producer in front of that
    action -- each such move alone, and all of one chain's moves together (a chain whose
    links are all tight gains only when every link moves)."""
    schedule = Schedule(name="zb-auto", pp=search.pp, num_microbatches=search.m,
                        ranks=search.best_ranks)
    sim = simulate(schedule, search.costs)
    position = {a: (r, i) for r, actions in enumerate(search.best_ranks)
                for i, a in enumerate(actions)}
    start, end = sim.start, sim.end
    values = sim.span if search.objective == "span" else [
        ends[-1] if ends else 0.0 for ends in sim.rank_ends]
    critical = max(range(search.pp), key=lambda r: (values[r], -r))
    moves: list[list[tuple[int, int, int]]] = []
    actions = search.best_ranks[critical]
    for i in range(1, len(actions)):
        if start[actions[i]] <= end[actions[i - 1]] + _TOL:
            continue
        action, seen, chain = actions[i], 0, []
        while action is not None and seen < search.pp:
            seen += 1
            rank, mb = action.rank, action.microbatch
            if action.kind is ActionKind.B and rank < search.pp - 1:
                producer = Action(rank=rank + 1, kind=ActionKind.B, microbatch=mb)
            elif action.kind is ActionKind.F and rank > 0:
                producer = Action(rank=rank - 1, kind=ActionKind.F, microbatch=mb)
            else:
                break
            q, k = position[producer]
            if k > 0:
                before = search.best_ranks[q][k - 1]
                if end[before] >= start[producer] - _TOL and not (
                        before.microbatch == mb and before.kind is ActionKind.F):
                    chain.append((q, k, k - 1))
                    if [chain[-1]] not in moves:
                        moves.append([chain[-1]])
            action = producer
        if len(chain) > 1 and chain not in moves:
            moves.append(chain)
    return moves


def _follow_chains(search: _Search) -> None:
    """Apply critical-path moves while one improves the objective."""
    improved = True
    while improved and not search.done:
        improved = False
        for move_set in _chain_moves(search):
            if search.done:
                return
            trial = list(search.best_ranks)
            for rank, pos, target in move_set:  # distinct ranks: positions stay valid
                moved = list(trial[rank])
                moved.insert(target, moved.pop(pos))
                trial[rank] = moved
            try:
                if search.offer(trial, "critical path"):
                    improved = True
                    break
            except ValueError:  # the move broke a dependency
                continue


def _move_w(search: _Search, seed: int = 0) -> None:
    """Random walk over single moves of a W (or, one draw in four, an F) by up to 3
    places on a rank (seeded: deterministic)."""
    rng = random.Random(seed)
    while not search.done:
        r = rng.randrange(search.pp)
        order = search.best_ranks[r]
        kind = ActionKind.F if rng.random() < 0.25 else ActionKind.W
        positions = [i for i, a in enumerate(order) if a.kind is kind]
        pos = rng.choice(positions)
        target = pos + rng.choice((-3, -2, -1, 1, 2, 3))
        if not 0 <= target < len(order):
            search.left -= 1  # a wasted draw still counts, so the walk always ends
            continue
        moved = list(order)
        moved.insert(target, moved.pop(pos))
        trial = list(search.best_ranks)
        trial[r] = moved
        try:
            search.offer(trial, "local search")
        except ValueError:  # a W moved before its B
            continue


def zb_auto(*, pp: int, num_microbatches: int, costs: CostModel | None = None,
            memory_limit: float | None = None, objective: str = "span",
            max_evaluations: int | None = None) -> Schedule:
    """Search a 1-chunk F/B/W schedule (name ``zb-auto``) minimising ``objective``.

    ``memory_limit`` is per rank in microbatch-activation units (default
    ``default_memory_limit``: 2 * pp). ``max_evaluations`` bounds the candidates scored
    (default ``default_max_evaluations``). The result depends only on the arguments.
    ``meta`` records objective, value (the objective's value), makespan (for the
    makespan objective), lower_bound, evaluations, search_seconds, memory_limit and
    source.
    """
    _check_shape(pp, num_microbatches)
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got "
                         f"{objective!r}")
    costs = CostModel() if costs is None else costs
    limit = default_memory_limit(pp, costs) if memory_limit is None else float(memory_limit)
    if limit < costs.mem_f:
        raise ValueError(f"memory_limit={limit} is below one microbatch's activations "
                         f"(mem_f={costs.mem_f}); raise --memory-limit")
    budget = (default_max_evaluations(pp, num_microbatches) if max_evaluations is None
              else max_evaluations)
    if not isinstance(budget, int) or budget < 1:
        raise ValueError(f"max_evaluations must be an integer >= 1, got {max_evaluations!r}")
    began = time.perf_counter()  # reported only; never decides anything
    bound = _bound(pp, num_microbatches, costs, limit, objective)
    search = _Search(pp, num_microbatches, costs, limit, objective,
                     budget + 3, bound)  # the hand-built orders do not count
    for name, ranks in _hand_built(pp, num_microbatches, costs, limit):
        search.offer(ranks, name)
    search.left = max(search.left, budget)
    inflight, w_slack = _construct(search)
    _descend(search, inflight, w_slack)
    if search.best_ranks is not None:
        _follow_chains(search)
        _move_w(search)
    if search.best_ranks is None:
        raise ValueError(f"zb-auto found no schedule within memory_limit={limit}; "
                         f"raise the memory limit")
    schedule = Schedule(name="zb-auto", pp=pp, num_microbatches=num_microbatches,
                        num_chunks=1, ranks=[list(r) for r in search.best_ranks])
    schedule.meta.update(objective=objective, value=search.best_value, lower_bound=bound,
                         memory_limit=limit, source=search.source,
                         evaluations=search.evaluations,
                         search_seconds=round(time.perf_counter() - began, 4))
    if objective == "makespan":
        schedule.meta["makespan"] = search.best_value
    return schedule
