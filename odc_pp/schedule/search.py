"""ZB-auto: search a 1-chunk F/B/W schedule for the given per-stage costs and memory limit.

Two phases, both driven by exact simulation of the candidate orders:

1. **Construction.** A time-ordered list scheduler (``_greedy``) plays all ranks
   forward in time. A free rank runs a ready B first (it is on the critical path),
   else a ready F if the rank has fewer than ``cap[rank]`` forwards in flight and the
   activation fits the memory limit, else a pending W when it fits into the gap before
   the next known arrival (or memory forces it), else it idles. Several warm-up depth
   families (``cap``) and W-slack values are tried.
2. **Improvement.** Coordinate descent over the per-rank warm-up depths (each rank's
   cap moved up and down, re-running the construction), then a local search that moves
   single W actions earlier into idle gaps of the critical ranks, evaluated by the
   specialised O(N) evaluator ``_evaluate`` with an early abort as soon as a candidate
   can no longer beat the incumbent.

The orders of ZB-H1 and 1F1B (fused BW split into B then W, which is never slower; the
same orders ``odc_pp.schedule.generators`` builds) are always simulated as extra
candidates, so the result is never worse than them when they fit the memory limit.
This module imports nothing from the generators (they build zb-auto through it).

Default memory limit: ``2 * pp`` microbatch activations (``2 * pp * costs.mem_f``),
twice what 1F1B needs on its first rank; this is the regime where zero bubble is
attainable. Pass ``memory_limit=pp * costs.mem_f`` for the 1F1B budget.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass

from .costs import CostModel
from .ir import Action, ActionKind, Schedule

__all__ = ["zb_auto", "makespan_lower_bound", "bubble_lower_bound", "default_memory_limit"]

_F, _B, _W = 0, 1, 2
_INF = float("inf")


@dataclass(kw_only=True)
class _Problem:
    """Per-rank costs of a 1-chunk pipeline, as plain lists for the hot loops."""

    pp: int
    """Pipeline ranks (= stages)."""
    num_microbatches: int
    """Microbatches per minibatch."""
    t_f: list[float]
    """Forward time per rank."""
    t_b: list[float]
    """Input-gradient time per rank."""
    t_w: list[float]
    """Weight-gradient time per rank."""
    t_comm: float
    """Transfer latency between neighbouring ranks."""
    mem_f: float
    """Memory change of F (applied at its start when positive)."""
    mem_b: float
    """Memory change of B."""
    mem_w: float
    """Memory change of W (applied at its end when negative)."""
    limit: float
    """Activation memory limit per rank (inf: none)."""

    def __post_init__(self) -> None:
        assert len(self.t_f) == len(self.t_b) == len(self.t_w) == self.pp


def default_memory_limit(pp: int, costs: CostModel) -> float:
    """``2 * pp`` microbatch activations per rank (see the module docstring)."""
    return 2.0 * pp * max(costs.mem_f, 1e-12)


def _problem(pp: int, num_microbatches: int, costs: CostModel,
             memory_limit: float | None) -> _Problem:
    def per_rank(kind):
        return [costs.compute_time(kind, stage=r, rank=r, pp=pp, num_stages=pp)
                for r in range(pp)]
    return _Problem(pp=pp, num_microbatches=num_microbatches,
                    t_f=per_rank(ActionKind.F), t_b=per_rank(ActionKind.B),
                    t_w=per_rank(ActionKind.W), t_comm=float(costs.t_comm),
                    mem_f=costs.mem_f, mem_b=costs.mem_b, mem_w=costs.mem_w,
                    limit=_INF if memory_limit is None else float(memory_limit))


# ----- lower bound ------------------------------------------------------------------
def _bound_terms(prob: _Problem) -> list[float]:
    """Per-rank makespan lower bounds (see ``makespan_lower_bound``)."""
    pp, m, c = prob.pp, prob.num_microbatches, prob.t_comm
    f, b, w = prob.t_f, prob.t_b, prob.t_w
    total_f = sum(f)
    held_f = prob.mem_f
    held_after_b = prob.mem_f + prob.mem_b
    unlimited = math.isinf(prob.limit)
    max_f_before_b = m if held_f <= 0 or unlimited else min(m, int(prob.limit / held_f + 1e-9))
    max_deferred_w = (m if held_after_b <= 0 or unlimited
                      else max(1, min(m, int(prob.limit / held_after_b + 1e-9))))
    terms = []
    for r in range(pp):
        arrive = sum(f[:r]) + r * c  # earliest start of the rank's first F
        first_b = total_f + (pp - 1) * c + sum(b[r + 1:]) + (pp - 1 - r) * c
        head = max(arrive + m * f[r], first_b + (m - max_f_before_b) * f[r])
        chain = sum(b[:r]) + r * c + w[0]  # after the rank's last B: B down to rank 0, W
        tail = max(m * w[r], (m - max_deferred_w) * w[r] + chain)
        terms.append(head + m * b[r] + tail)
    return terms


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

    Without a memory limit ``K_f = K_w = m``, which reduces to
    ``max_r (a_r + m*(F_r + B_r + W_r))``: the busiest rank's work plus the unavoidable
    warm-up before it. The bound is the maximum over ranks.
    """
    if pp < 1 or num_microbatches < 1:
        raise ValueError(f"need pp >= 1 and num_microbatches >= 1, got pp={pp}, "
                         f"num_microbatches={num_microbatches}")
    return max(_bound_terms(_problem(pp, num_microbatches, costs, memory_limit)))


def bubble_lower_bound(pp: int, num_microbatches: int, costs: CostModel,
                       memory_limit: float | None = None) -> float:
    """``(LB - busy_max) / LB`` with LB = ``makespan_lower_bound``: the smallest
    makespan-normalised bubble (idle share of the busiest rank) any schedule can reach."""
    prob = _problem(pp, num_microbatches, costs, memory_limit)
    bound = max(_bound_terms(prob))
    busiest = max(num_microbatches * (prob.t_f[r] + prob.t_b[r] + prob.t_w[r])
                  for r in range(pp))
    return (bound - busiest) / bound if bound > 0 else 0.0


# ----- construction -----------------------------------------------------------------
def _greedy(prob: _Problem, caps: list[int], w_slack: float):
    """List-schedule all ranks; returns (orders, makespan) or None if memory blocks."""
    pp, m, c = prob.pp, prob.num_microbatches, prob.t_comm
    t_f, t_b, t_w = prob.t_f, prob.t_b, prob.t_w
    mem_f, mem_b, mem_w, limit = prob.mem_f, prob.mem_b, prob.mem_w, prob.limit + 1e-9
    end_f = [[None] * m for _ in range(pp)]
    end_b = [[None] * m for _ in range(pp)]
    nf, nb, nw = [0] * pp, [0] * pp, [0] * pp
    mem = [0.0] * pp
    free = [0.0] * pp
    scheduled = [0.0] * pp
    orders: list[list[tuple[int, int]]] = [[] for _ in range(pp)]
    heap = [(0.0, r) for r in range(pp)]
    heapq.heapify(heap)
    done = 0
    makespan = 0.0

    def wake(rank: int, at: float) -> None:
        at = max(at, free[rank])
        if at < scheduled[rank]:
            scheduled[rank] = at
            heapq.heappush(heap, (at, rank))

    while heap:
        now, r = heapq.heappop(heap)
        if now != scheduled[r]:
            continue  # stale entry
        scheduled[r] = _INF
        i_f, i_b, i_w = nf[r], nb[r], nw[r]
        # arrival times of the next F input and the next B gradient (None: unknown)
        if i_f < m:
            f_at = 0.0 if r == 0 else end_f[r - 1][i_f]
            if f_at is not None and r > 0:
                f_at += c
        else:
            f_at = _INF
        if i_b < i_f:
            b_at = end_f[r][i_b] if r == pp - 1 else end_b[r + 1][i_b]
            if b_at is not None and r < pp - 1:
                b_at += c
        else:
            b_at = _INF if i_b >= m else None
        f_allowed = i_f < m and i_f - i_b < caps[r]
        f_fits = mem[r] + max(mem_f, 0.0) <= limit
        b_fits = mem_b <= 0 or mem[r] + mem_b <= limit
        kind = -1
        if b_at is not None and b_at <= now and b_fits:
            kind = _B
        elif f_allowed and f_fits and f_at is not None and f_at <= now:
            kind = _F
        elif i_w < i_b:
            # earliest moment a B or F could start; unknown arrivals come no sooner than
            # the producer's duration plus the transfer from now
            if b_at is None:
                b_next = now + (t_b[r + 1] + c if r < pp - 1 else 0.0)
            else:
                b_next = b_at
            nxt = b_next
            if f_allowed and f_fits:
                nxt = min(nxt, f_at if f_at is not None else now + t_f[r - 1] + c)
            memory_bound = (f_allowed and not f_fits) or not b_fits
            if memory_bound or now + t_w[r] <= nxt + w_slack * t_w[r]:
                kind = _W
        if kind == -1:
            nxt = _INF
            if b_at is not None and b_at > now:
                nxt = b_at
            if f_allowed and f_fits and f_at is not None and f_at > now:
                nxt = min(nxt, f_at)
            if nxt < _INF:
                wake(r, nxt)
            continue  # otherwise sleep until a neighbour produces
        if kind == _F:
            mem[r] += mem_f
            end = now + t_f[r]
            end_f[r][i_f] = end
            nf[r] = i_f + 1
            orders[r].append((_F, i_f))
            if r < pp - 1:
                wake(r + 1, end + c)
        elif kind == _B:
            mem[r] += mem_b
            end = now + t_b[r]
            end_b[r][i_b] = end
            nb[r] = i_b + 1
            orders[r].append((_B, i_b))
            if r > 0:
                wake(r - 1, end + c)
        else:
            end = now + t_w[r]
            mem[r] += mem_w
            nw[r] = i_w + 1
            orders[r].append((_W, i_w))
            if nw[r] == m:
                done += 1
        free[r] = end
        makespan = max(makespan, end)
        if nw[r] < m:
            wake(r, end)
    if done != pp:
        return None
    return orders, makespan


# ----- evaluation of fixed orders ----------------------------------------------------
def _evaluate(prob: _Problem, orders: list[list[tuple[int, int]]],
              cutoff: float = _INF) -> float | None:
    """Makespan of fixed per-rank orders (implicit comm), None when a rank exceeds the
    memory limit, the orders deadlock, or the makespan reaches ``cutoff``."""
    pp, m, c = prob.pp, prob.num_microbatches, prob.t_comm
    limit = prob.limit + 1e-9
    dur = (prob.t_f, prob.t_b, prob.t_w)
    end_f = [[None] * m for _ in range(pp)]
    end_b = [[None] * m for _ in range(pp)]
    deltas = (prob.mem_f, prob.mem_b, prob.mem_w)
    pointer = [0] * pp
    free = [0.0] * pp
    mem = [0.0] * pp
    waiting: dict[tuple[int, int, int], int] = {}
    stack = list(range(pp))
    makespan = 0.0
    while stack:
        r = stack.pop()
        order = orders[r]
        pos, now, used = pointer[r], free[r], mem[r]
        ef, eb = end_f[r], end_b[r]
        while pos < len(order):
            kind, mb = order[pos]
            if kind == _F:
                if r == 0:
                    ready = now
                else:
                    dep = end_f[r - 1][mb]
                    if dep is None:
                        waiting[(_F, r - 1, mb)] = r
                        break
                    ready = max(now, dep + c)
            elif kind == _B:
                if ef[mb] is None:
                    return None
                if r == pp - 1:
                    ready = now
                else:
                    dep = end_b[r + 1][mb]
                    if dep is None:
                        waiting[(_B, r + 1, mb)] = r
                        break
                    ready = max(now, dep + c)
            else:
                if eb[mb] is None:
                    return None
                ready = now
            delta = deltas[kind]
            if delta > 0:
                used += delta
                if used > limit:
                    return None
            now = ready + dur[kind][r]
            if now >= cutoff:
                return None
            if delta < 0:
                used += delta
            if kind == _F:
                ef[mb] = now
                waiter = waiting.pop((_F, r, mb), None)
            elif kind == _B:
                eb[mb] = now
                waiter = waiting.pop((_B, r, mb), None)
            else:
                waiter = None
            if waiter is not None:
                stack.append(waiter)
            pos += 1
        pointer[r], free[r], mem[r] = pos, now, used
        if now > makespan:
            makespan = now
    if any(pointer[r] < len(orders[r]) for r in range(pp)):
        return None
    return makespan


# ----- search -----------------------------------------------------------------------
def _cap_families(prob: _Problem) -> list[list[int]]:
    """Warm-up depth candidates: 1F1B-like ``pp - r + k``, round-trip-based, unlimited."""
    pp, m, c = prob.pp, prob.num_microbatches, prob.t_comm
    period = max(prob.t_f[r] + prob.t_b[r] + prob.t_w[r] for r in range(pp))
    families = []
    for extra in (0, 1, 2, 4):
        families.append([min(m, pp - r + extra) for r in range(pp)])
    for scale in (1.0, 1.5, 2.0, 3.0):
        caps = []
        for r in range(pp):
            round_trip = (sum(prob.t_f[r:]) + sum(prob.t_b[r + 1:]) + 2 * (pp - 1 - r) * c)
            caps.append(max(1, min(m, math.ceil(scale * round_trip / period))))
        families.append(caps)
    families.append([m] * pp)
    unique = []
    for caps in families:
        if caps not in unique:
            unique.append(caps)
    return unique


@dataclass
class _Best:
    makespan: float = _INF
    orders: list | None = None
    source: str = ""

    def offer(self, makespan: float | None, orders, source: str) -> bool:
        if makespan is not None and makespan < self.makespan - 1e-9:
            self.makespan, self.orders, self.source = makespan, orders, source
            return True
        return False


def _construct(prob: _Problem, best: _Best, deadline: float,
               bound: float) -> tuple[list[int], float]:
    best_caps, best_slack = [prob.num_microbatches] * prob.pp, 0.0
    for caps in _cap_families(prob):
        for w_slack in (0.0, 0.5, 1.0):
            if best.makespan <= bound + 1e-9:
                return best_caps, best_slack  # optimal: nothing left to find
            if time.perf_counter() > deadline and best.orders is not None:
                return best_caps, best_slack
            result = _greedy(prob, caps, w_slack)
            if result is not None:
                orders, _ = result
                if best.offer(_evaluate(prob, orders), orders, "greedy"):
                    best_caps, best_slack = caps, w_slack
    return best_caps, best_slack


def _descend_caps(prob: _Problem, best: _Best, caps: list[int], w_slack: float,
                  deadline: float) -> None:
    """Coordinate descent over per-rank warm-up depths (re-running the construction)."""
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        for r in range(prob.pp):
            for step in (1, -1, 2, -2):
                if time.perf_counter() > deadline:
                    return
                trial = list(caps)
                trial[r] = max(1, min(prob.num_microbatches, trial[r] + step))
                if trial[r] == caps[r]:
                    continue
                result = _greedy(prob, trial, w_slack)
                if result is None:
                    continue
                orders, _ = result
                if best.offer(_evaluate(prob, orders, best.makespan), orders, "greedy+caps"):
                    caps, improved = trial, True
                    break


def _critical_ranks(prob: _Problem) -> list[int]:
    busy = [prob.num_microbatches * (prob.t_f[r] + prob.t_b[r] + prob.t_w[r])
            for r in range(prob.pp)]
    return sorted(range(prob.pp), key=lambda r: -busy[r])


def _move_w_earlier(prob: _Problem, best: _Best, deadline: float, rng_seed: int = 0) -> None:
    """Local search: move one W a few places earlier (or later) on a rank; keep improvements."""
    import random
    rng = random.Random(rng_seed)
    ranks = _critical_ranks(prob)
    stale = 0
    while time.perf_counter() < deadline and stale < 4 * prob.pp * prob.num_microbatches:
        r = ranks[0] if rng.random() < 0.5 else rng.randrange(prob.pp)
        order = best.orders[r]
        w_positions = [i for i, (kind, _) in enumerate(order) if kind == _W]
        if not w_positions:
            stale += 1
            continue
        pos = rng.choice(w_positions)
        shift = rng.choice((-3, -2, -1, 1, 2, 3))
        target = pos + shift
        if not 0 <= target < len(order):
            stale += 1
            continue
        new_order = list(order)
        item = new_order.pop(pos)
        new_order.insert(target, item)
        trial = list(best.orders)
        trial[r] = new_order
        if best.offer(_evaluate(prob, trial, best.makespan), trial, "local search"):
            stale = 0
        else:
            stale += 1


def _pattern_orders(pp: int, m: int, warmup_extra: int, w_defer_extra: int):
    """1F1B-shaped order: rank r warms up with pp-r-1+warmup_extra forwards, then F,B
    pairs, deferring up to r+w_defer_extra W passes (ZB-H1 is extra 0/0; 1F1B with W
    right after B is w_defer_extra=-pp)."""
    orders = []
    for rank in range(pp):
        warmup = max(0, min(pp - rank - 1 + warmup_extra, m))
        defer = max(0, rank + w_defer_extra)
        order = [(_F, i) for i in range(warmup)]
        next_f, next_b, next_w = warmup, 0, 0
        while next_b < m:
            if next_f < m:
                order.append((_F, next_f))
                next_f += 1
            order.append((_B, next_b))
            next_b += 1
            if next_b - next_w > defer or next_f >= m:
                order.append((_W, next_w))
                next_w += 1
        order += [(_W, i) for i in range(next_w, m)]
        orders.append(order)
    return orders


def _baseline_orders(pp: int, num_microbatches: int):
    """1F1B and ZB-H1 (their generators' orders with BW split into B then W) and a few
    deeper variants of the same pattern."""
    found = [("1f1b", _pattern_orders(pp, num_microbatches, 0, -pp)),
             ("zb-h1", _pattern_orders(pp, num_microbatches, 0, 0))]
    for warmup_extra, defer_extra in ((0, 1), (1, 0), (pp // 2, pp // 2), (pp, pp)):
        found.append((f"pattern+{warmup_extra}/{defer_extra}",
                      _pattern_orders(pp, num_microbatches, warmup_extra, defer_extra)))
    return found


def _auto_budget(pp: int, num_microbatches: int) -> float:
    return min(20.0, 0.2 + 0.0006 * 3 * pp * num_microbatches)


def zb_auto(*, pp: int, num_microbatches: int, costs: CostModel | None = None,
            memory_limit: float | None = None, time_budget_s: float | None = None) -> Schedule:
    """Search a 1-chunk F/B/W schedule (name ``zb-auto``) minimising the makespan.

    ``memory_limit`` is per rank in microbatch-activation units (default
    ``default_memory_limit``: 2 * pp). ``time_budget_s`` bounds the search (default
    scales with pp * num_microbatches: ~0.6 s for pp=8, m=32; 14 s for pp=32, m=256).
    ``meta`` records makespan, lower_bound, search_seconds, memory_limit and source.
    """
    if pp < 1 or num_microbatches < 1:
        raise ValueError(f"zb-auto needs pp >= 1 and num_microbatches >= 1, got pp={pp}, "
                         f"num_microbatches={num_microbatches}")
    costs = CostModel() if costs is None else costs
    limit = default_memory_limit(pp, costs) if memory_limit is None else float(memory_limit)
    if limit < costs.mem_f:
        raise ValueError(f"memory_limit={limit} is below one microbatch's activations "
                         f"(mem_f={costs.mem_f}); raise --memory-limit")
    budget = _auto_budget(pp, num_microbatches) if time_budget_s is None else time_budget_s
    if budget <= 0:
        raise ValueError(f"time_budget_s must be > 0, got {time_budget_s}")
    began = time.perf_counter()
    deadline = began + budget
    prob = _problem(pp, num_microbatches, costs, limit)
    best = _Best()
    for name, orders in _baseline_orders(pp, num_microbatches):
        best.offer(_evaluate(prob, orders), orders, name)
    bound = max(_bound_terms(prob))
    caps, w_slack = _construct(prob, best, began + 0.6 * budget, bound)
    if best.makespan > bound + 1e-9:
        _descend_caps(prob, best, caps, w_slack, began + 0.8 * budget)
    if best.makespan > bound + 1e-9:
        _move_w_earlier(prob, best, deadline)
    if best.orders is None:
        raise ValueError(f"zb-auto found no schedule within memory_limit={limit}; "
                         f"raise the memory limit")
    schedule = Schedule(name="zb-auto", pp=pp, num_microbatches=num_microbatches,
                        num_chunks=1)
    kinds = (ActionKind.F, ActionKind.B, ActionKind.W)
    for rank, order in enumerate(best.orders):
        schedule.extend(Action(rank=rank, kind=kinds[kind], chunk=0, microbatch=mb)
                        for kind, mb in order)
    schedule.meta.update(makespan=best.makespan, lower_bound=bound, memory_limit=limit,
                         source=best.source,
                         search_seconds=round(time.perf_counter() - began, 4))
    return schedule
