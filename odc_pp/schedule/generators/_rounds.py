"""Round-based V construction: the zero-bubble paper's greedy ZB-V order (one candidate of
the V families, ``memory.v_family``).

The zero-bubble paper builds ZB-V not by a fixed pattern but greedily, in rounds. This
module follows that construction as described by its authors (our own code):

* **warm-up**: microbatch 0's forward runs down the V; then, from the turn of the V
  back to rank 0, every rank runs extra chunk-0 forwards while they fit in memory
  (keeping room for the chunk-1 forwards still to come) and end before its first
  chunk-1 input arrives; then the lower ranks catch up so that every rank holds at least
  as many forwards as the rank before it;
* **steady rounds**: each round gives every rank one backward (the chunk whose input
  is there, the chunk-1 backward of the oldest microbatch otherwise) and then one
  forward. Before each, pending W passes fill the wait for its input when they end
  before it arrives; a W also runs when the wait would push the rank's idle time past an
  allowance (the largest idle time of any rank so far, or with ``approved`` the spread of
  a previous pass's idle times), for chunk-0 backwards always and for chunk-1 backwards
  and forwards only with ``fill_b`` / ``fill_f``;
* the remaining W passes close each rank.

A pass that ends with a smaller worst idle time than the allowances it was given is
repeated with its own idle times as the new allowances; the best of the passes is kept.
The builder tracks in-order start times to make these choices (like the list
scheduler's clock, the simulator's in-order timing with implicit transfers); the caller
may drop a variant whose idle time by that clock is past its cutoff, and scores the
others with ``odc_pp.schedule.simulator``. A pass that
the memory cap or a missing input would break returns None (the candidate is dropped).
"""

from __future__ import annotations

from collections import deque

from ..costs import CostModel
from ..ir import Action, ActionKind, Placement
from ..placement import num_stages, stage_of

__all__ = ["v_rounds_orders"]

_F, _B, _W = ActionKind.F, ActionKind.B, ActionKind.W


class _Infeasible(Exception):
    """A pass would exceed the memory cap or run an action before its input exists."""


class _Pass:
    def __init__(self, pp: int, m: int, costs: CostModel, cap: float,
                 approved: list[float] | None) -> None:
        self.pp, self.m, self.cap = pp, m, cap + 1e-9
        stages = num_stages(pp, 2)
        stage = [[stage_of(Placement.V, pp, r, c) for c in (0, 1)] for r in range(pp)]
        # per kind, rank, chunk: duration; per kind, rank, chunk, microbatch: end time
        self.time = {kind: [[costs.compute_time(kind, stage=stage[r][c], rank=r, pp=pp,
                                                num_stages=stages) for c in (0, 1)]
                            for r in range(pp)] for kind in (_F, _B, _W)}
        self.end = {kind: [[[None] * m for _ in (0, 1)] for _ in range(pp)]
                    for kind in (_F, _B, _W)}
        self.source = {kind: [[self._source(kind, r, c, costs.t_comm) for c in (0, 1)]
                              for r in range(pp)] for kind in (_F, _B)}
        self.delta = {_F: costs.mem_f, _B: costs.mem_b, _W: costs.mem_w}
        self.comm = costs.t_comm
        self.count = {kind: [[0, 0] for _ in range(pp)] for kind in (_F, _B)}
        self.free = [0.0] * pp
        self.started = [False] * pp
        self.idle = [0.0] * pp
        self.worst = 0.0  # max(self.idle)
        self.mem = [0.0] * pp
        self.pending: list[deque] = [deque() for _ in range(pp)]
        self.orders: list[list[tuple]] = [[] for _ in range(pp)]  # (kind, chunk, mb)
        self.approved = approved
        self.top_approved = max(approved) if approved else 0.0

    # ----- inputs ---------------------------------------------------------------------
    def _source(self, kind: ActionKind, rank: int, chunk: int, comm: float):
        """(kind, rank, chunk, latency) of the action whose output a (kind, rank, chunk)
        action of the same microbatch needs (None: the start of the V, or for the last
        stage's backward only its own forward)."""
        pp = self.pp
        if kind is _F:
            if chunk == 0:
                return None if rank == 0 else (_F, rank - 1, 0, comm)
            return (_F, rank, 0, 0.0) if rank == pp - 1 else (_F, rank + 1, 1, comm)
        if chunk == 1:
            return None if rank == 0 else (_B, rank - 1, 1, comm)
        return (_B, rank, 1, 0.0) if rank == pp - 1 else (_B, rank + 1, 0, comm)

    def arrival(self, kind: ActionKind, rank: int, chunk: int) -> float | None:
        """When the next (kind, chunk) action's input is there (None: no input needed);
        raises _Infeasible when its producer has not been placed."""
        need = self.source[kind][rank][chunk]
        if need is None:
            return None
        mb = self.count[kind][rank][chunk]
        producer, other, other_chunk, latency = need
        end = self.end[producer][other][other_chunk][mb]
        if end is None:
            raise _Infeasible(f"{kind.value}{chunk}.{mb} on rank {rank} has no input yet")
        return end + latency

    def placed(self, kind: ActionKind, rank: int, chunk: int) -> bool:
        need = self.source[kind][rank][chunk]
        if need is None:
            return True
        producer, other, other_chunk, _ = need
        return self.end[producer][other][other_chunk][self.count[kind][rank][chunk]] \
            is not None

    # ----- placing ----------------------------------------------------------------------
    def put(self, kind: ActionKind, rank: int, chunk: int) -> None:
        if kind is _W:
            chunk, mb = self.pending[rank].popleft()
            ready = self.end[_B][rank][chunk][mb]
        else:
            mb = self.count[kind][rank][chunk]
            if mb >= self.m:
                raise _Infeasible(f"no {kind.value}{chunk} left on rank {rank}")
            ready = self.arrival(kind, rank, chunk)
            if kind is _B:
                own = self.end[_F][rank][chunk][mb]
                if own is None:
                    raise _Infeasible(f"B{chunk}.{mb} on rank {rank} before its F")
                ready = own if ready is None else max(ready, own)
        delta = self.delta[kind]
        if self.mem[rank] + delta > self.cap:
            raise _Infeasible(f"memory cap on rank {rank}")
        start = self.free[rank]
        if ready is not None and ready > start:
            if self.started[rank]:
                idle = self.idle[rank] = self.idle[rank] + (ready - start)
                if idle > self.worst:
                    self.worst = idle
            start = ready
        self.started[rank] = True
        end = self.free[rank] = start + self.time[kind][rank][chunk]
        self.end[kind][rank][chunk][mb] = end
        self.mem[rank] += delta
        if kind is not _W:
            self.count[kind][rank][chunk] += 1
            if kind is _B:
                self.pending[rank].append((chunk, mb))
        self.orders[rank].append((kind, chunk, mb))

    def allowance(self, rank: int) -> float:
        worst = self.worst
        if self.approved is not None:
            worst = max(worst, self.top_approved - self.approved[rank])
        return worst

    def fill_before(self, kind: ActionKind, rank: int, chunk: int, extra: bool) -> None:
        """W passes that end before the input of the next (kind, chunk) arrives; one more
        if ``extra`` and the wait would exceed the rank's allowance."""
        need = self.source[kind][rank][chunk]
        if need is None or need[1] == rank:
            return  # no input from another rank: no wait to fill
        arrival = self.arrival(kind, rank, chunk)
        pending = self.pending[rank]
        t_w = self.time[_W][rank]
        while pending and arrival >= self.free[rank] + t_w[pending[0][0]]:
            self.put(_W, rank, 0)
        if extra and pending and arrival - self.free[rank] > \
                self.allowance(rank) - self.idle[rank]:
            self.put(_W, rank, 0)

    def make_room(self, kind: ActionKind, rank: int) -> None:
        while self.mem[rank] + self.delta[kind] > self.cap:
            if not self.pending[rank]:
                raise _Infeasible(f"memory cap on rank {rank} with no W to run")
            self.put(_W, rank, 0)

    # ----- phases -----------------------------------------------------------------------
    def warm_up(self) -> None:
        pp, m = self.pp, self.m
        for rank in range(pp):
            self.put(_F, rank, 0)
        for rank in range(pp - 1, -1, -1):
            if rank < pp - 1:
                turn = self.end[_F][rank + 1][1][0] + self.comm
                while (self.mem[rank] + self.delta[_F] * (2 + 2 * rank) <= self.cap and
                       self.free[rank] + self.time[_F][rank][0] <= turn and
                       self.count[_F][rank][0] < m - rank):
                    for lower in range(rank + 1):
                        self.put(_F, lower, 0)
            self.put(_F, rank, 1)
        chunk = 0
        for rank in range(1, pp):
            mine, before = self.count[_F][rank], self.count[_F][rank - 1]
            while (mine[0] + mine[1] < before[0] + before[1] or
                   mine[1] <= before[1] < m):
                for other in range(pp - 1, rank - 1, -1):
                    if self.count[_F][other][chunk] < m:
                        self.put(_F, other, chunk)
                chunk = 1 - chunk

    def backward_chunk(self, rank: int) -> int:
        count = self.count[_B][rank]
        if count[1] <= count[0]:
            return 1
        if rank == self.pp - 1:
            return 0
        return 0 if self.placed(_B, rank, 0) or count[1] >= self.m else 1

    def forward_chunk(self, rank: int) -> int | None:
        count = self.count[_F][rank]
        if count[1] >= count[0]:
            return 0
        if rank == self.pp - 1 or self.placed(_F, rank, 1):
            return 1
        if count[0] < self.m and (rank == 0 or self.placed(_F, rank, 0)):
            return 0
        return None

    def run(self, fill_f: bool, fill_b: bool) -> None:
        pp, m = self.pp, self.m
        self.warm_up()
        for _ in range(2 * m):
            for rank in range(pp):
                self.make_room(_B, rank)
            chunks = [self.backward_chunk(rank) for rank in range(pp)]
            order = [(rank, 0) for rank in range(pp - 1, -1, -1) if chunks[rank] == 0]
            order += [(rank, 1) for rank in range(pp) if chunks[rank] == 1]
            for rank, chunk in order:
                if self.count[_B][rank][chunk] >= m:
                    continue
                self.fill_before(_B, rank, chunk, extra=chunk == 0 or fill_b)
                self.put(_B, rank, chunk)
            for rank in range(pp):
                if self.count[_F][rank][1] >= m:
                    continue
                chunk = self.forward_chunk(rank)
                if chunk is None or self.count[_F][rank][chunk] >= m:
                    continue
                self.make_room(_F, rank)
                self.fill_before(_F, rank, chunk, extra=fill_f)
                self.put(_F, rank, chunk)
        for rank in range(pp):
            while self.pending[rank]:
                self.put(_W, rank, 0)
        if any(n != m for counts in self.count.values() for rank in counts for n in rank):
            raise _Infeasible("a pass left actions unplaced")


def _search(pp: int, m: int, costs: CostModel, cap: float, fill_f: bool, fill_b: bool,
            max_passes: int) -> tuple[float, list] | None:
    """Best (worst idle time, orders) over repeated passes (see module doc)."""
    best, approved = None, None
    for _ in range(max_passes):
        attempt = _Pass(pp, m, costs, cap, approved)
        try:
            attempt.run(fill_f, fill_b)
        except _Infeasible:
            break
        worst = max(attempt.idle)
        if best is not None and worst >= best[0]:
            break
        best, approved = (worst, attempt.orders), list(attempt.idle)
    return best


def v_rounds_orders(pp: int, num_microbatches: int, costs: CostModel, cap: float, *,
                    fill_f: bool, fill_b: bool,
                    max_passes: int = 8) -> tuple[float, list[list[Action]]] | None:
    """(worst per-rank idle time by the builder's own in-order clock, per-rank orders) of
    the round-based V construction with the given W-fill switches (the best of at most
    ``max_passes`` passes), or None when no pass fits ``cap``."""
    best = _search(pp, num_microbatches, costs, cap, fill_f, fill_b, max_passes)
    if best is None:
        return None
    worst, orders = best
    return worst, [[Action(rank=rank, kind=kind, chunk=chunk, microbatch=mb)
                    for kind, chunk, mb in actions] for rank, actions in enumerate(orders)]
