"""Check 7 of :mod:`odc_pp.schedule.validate`: replay a lowered schedule under NCCL
semantics (:func:`check_nccl_order`).

Three rules, on the communicators ``channel_key`` maps the messages to:

* **creation rendezvous**: the first operation a rank issues on a communicator blocks
  that rank (the host: nothing after it is issued, no compute runs) until every member
  has reached its own first operation on that communicator -- NCCL's lazy communicator
  creation (``ncclCommInitRank`` after the unique id went through the store);
* **FIFO**: per rank and communicator, operations (a batch counts as one) run strictly
  in issue order; a receive blocks what is queued behind it;
* **rendezvous send**: the head's send to ``p`` completes only when ``p``'s head on
  that communicator is the matching receive (taken conservatively).

``warm_up=True`` replays the start-up warm-up first (:mod:`odc_pp.runtime.warmup`): every
rank touches each of its communicators once, in :func:`warmup_order`, and each touch is
that communicator's creation. ``warm_up=False`` models code without it (lazy creation at
the schedule's first message), which deadlocks for several families.
"""

from __future__ import annotations

from collections import defaultdict, deque

from .channels import (ChannelLayout, channel_communicators, channel_key, channel_members,
                       warmup_order)
from .checks import ScheduleError, message_route
from .checks import where as _where
from .ir import COMM_KINDS, Action, ActionKind, Schedule

__all__ = ["check_nccl_order", "check_creation_order", "check_ring_order"]


def check_nccl_order(schedule: Schedule, layout=None, *, batch_sends: bool = True,
                     warm_up: bool = True) -> None:
    """Replay the runtime's operations of a lowered ``schedule`` under the rules of the
    module doc and raise ScheduleError naming the stuck ranks and actions if they
    deadlock.

    Model (what :class:`odc_pp.runtime.PipelineRuntime` issues, receives not pre-posted,
    shapes known so one operation per message): a run of consecutive SEND/RECV actions
    posts each RECV as one non-blocking ``irecv``, then its SENDs together -- one
    ``batch_isend_irecv`` per communicator when ``batch_sends`` and more than one,
    else single ``isend``s. Communicators come from ``channel_key(layout, ...)``
    (default layout: DIRECTED). A compute waits for the receive of its input; the rank's
    end waits for all its sends. ``warm_up``: creation happens in the start-up warm-up
    (see the module doc), else at each communicator's first schedule operation."""
    _Replay(schedule, layout, batch_sends=batch_sends, warm_up=warm_up).run()


def check_creation_order(sequences: dict[int, list], members: dict) -> None:
    """Replay only the creation rule: rank ``r`` issues the first operation on each
    communicator of ``sequences[r]`` in turn, and each blocks until every rank of
    ``members[key]`` reached it. Raise ScheduleError naming the stuck ranks and what
    they wait for (e.g. a warm-up order that ranks do not share)."""
    position = {rank: 0 for rank in sequences}
    arrived: dict = defaultdict(set)
    moved = True
    while moved:
        moved = False
        for rank, sequence in sequences.items():
            while position[rank] < len(sequence):
                key = sequence[position[rank]]
                arrived[key].add(rank)
                if not set(members[key]) <= arrived[key]:
                    break
                position[rank] += 1
                moved = True
    stuck = [rank for rank, sequence in sequences.items() if position[rank] < len(sequence)]
    if stuck:
        lines = []
        for rank in stuck:
            key = sequences[rank][position[rank]]
            missing = sorted(set(members[key]) - arrived[key])
            lines.append(f"rank {rank} waits in the creation of {key} for rank(s) {missing}")
        raise ScheduleError("communicator creation deadlocks: " + "; ".join(lines))


def check_ring_order(plans, *, name: str = "context-parallel ring") -> int:
    """Replay one communicator's batched point-to-point calls under the FIFO and
    rendezvous rules of the module doc and return the rounds it took. ``plans[r]`` is
    rank ``r``'s sequence of ``batch_isend_irecv`` calls on it (a list or a dict by rank;
    each call a list of ``(op, payload, peer)``, ``op`` ``send`` / ``recv``, ``peer`` a
    group rank), e.g. what :func:`odc_pp.megatron.context_parallel.ring_comm_plan` posts
    in one attention forward or backward. A batch runs as one NCCL group: it completes
    once its operations towards each peer meet that peer's opposite operations in the
    batch at the head of the peer's queue, payload for payload in issue order (each
    direction apart; another order would hand over the wrong message). Raise
    ScheduleError naming each stuck rank, its batch and what it waits for when no head
    batch can complete, or the two ranks whose messages would be mismatched.

    The ranks of a context-parallel group hold the same pipeline stage, so they run the
    same schedule's compute actions in the same order, each posting the same plan: the
    communicator's whole sequence is these plans repeated, and checking one plan (forward
    and backward) checks the sequence."""
    plans = dict(enumerate(plans)) if isinstance(plans, list) else dict(plans)
    position = {rank: 0 for rank in plans}

    def head(rank):
        batches = plans.get(rank, [])
        return batches[position[rank]] if position[rank] < len(batches) else None

    def waits(rank) -> list[str]:
        """What rank's head batch still waits for (empty: it can complete)."""
        batch, missing = head(rank), []
        for op, peer in dict.fromkeys((op, p) for op, _, p in batch):
            mine = [payload for o, payload, p in batch if (o, p) == (op, peer)]
            other = head(peer) or []
            theirs = [payload for o, payload, p in other
                      if (o, p) == ("recv" if op == "send" else "send", rank)]
            if theirs and theirs != mine:
                raise ScheduleError(f"{name}: rank {rank} batch {position[rank]} {op}s "
                                    f"{mine} {'to' if op == 'send' else 'from'} rank {peer}, "
                                    f"whose batch {position.get(peer)} matches them with "
                                    f"{theirs}: a mismatch")
            if theirs != mine:
                missing += [f"{op} {payload} {'to' if op == 'send' else 'from'} rank {peer}"
                            for payload in mine]
        return missing

    rounds = 0
    while any(head(rank) is not None for rank in plans):
        ready = [rank for rank in plans if head(rank) is not None and not waits(rank)]
        if not ready:
            lines = [f"rank {rank} batch {position[rank]} waits: {', '.join(waits(rank))}"
                     for rank in plans if head(rank) is not None]
            raise ScheduleError(f"{name} deadlocks under NCCL's FIFO order: "
                                + "; ".join(lines))
        for rank in ready:
            position[rank] += 1
        rounds += 1
    return rounds


class _Replay:
    """State of one replay: an op is ``[is_send, peer, message, done, (rank, pos, act)]``;
    a rank's backlog holds issued events ``(key, ops or None, where)`` not yet past
    their communicator's creation."""

    def __init__(self, schedule: Schedule, layout, *, batch_sends: bool,
                 warm_up: bool) -> None:
        self.schedule = schedule
        self.layout = ChannelLayout.DIRECTED if layout is None else layout
        self.batch_sends = batch_sends
        self.key = lambda src, dst, batched=False: channel_key(self.layout, src, dst,
                                                               batched=batched)
        self.members = lambda key: channel_members(key, schedule.pp)
        pp = schedule.pp
        self.queues: dict[tuple[int, tuple], list[list[list]]] = defaultdict(list)
        self.recv_op: list[dict[tuple, list]] = [{} for _ in range(pp)]
        self.sends_open = [0] * pp
        self.pointer = [0] * pp
        self.backlog: list[deque] = [deque() for _ in range(pp)]
        self.arrived: dict[tuple, set[int]] = defaultdict(set)
        self.created: set[tuple] = set()
        if warm_up:
            for comm in warmup_order(channel_communicators(list(range(pp)),
                                                           layout=self.layout)):
                src, dst = comm.detail or comm.ranks[:2]
                key = self.key(src, dst, batched=True)
                for rank in comm.ranks:
                    self.backlog[rank].append((key, None, f"rank {rank} warm-up"))

    # ----- issuing -------------------------------------------------------------
    def issue(self, rank: int, position: int) -> int:
        """Queue the events of the comm run at ``position``; return the run's end."""
        actions = self.schedule.ranks[rank]
        end = position
        while end < len(actions) and actions[end].kind in COMM_KINDS:
            end += 1
        sends: dict[tuple, list[list]] = defaultdict(list)
        for index in range(position, end):
            action = actions[index]
            message, src, dst, _ = message_route(self.schedule, action)
            sending = action.kind in (ActionKind.SEND_F, ActionKind.SEND_B)
            op = [sending, action.peer, message, False, (rank, index, action)]
            if not sending:
                where = _where(rank, index, action)
                self.backlog[rank].append((self.key(src, dst), [op], where))
                self.recv_op[rank][message] = op
                continue
            self.sends_open[rank] += 1
            sends[self.key(src, dst, batched=True)].append(op)
        for key, ops in sends.items():
            if self.batch_sends and len(ops) > 1:
                self.backlog[rank].append((key, ops, _where(*ops[0][4])))
            else:
                for op in ops:
                    self.backlog[rank].append((self.key(rank, op[1]), [op],
                                               _where(*op[4])))
        return end

    def flush(self, rank: int) -> bool:
        """Move the rank's backlog onto its communicators' FIFOs up to the first event
        whose communicator is still waiting for members. True when the backlog is
        empty."""
        backlog = self.backlog[rank]
        while backlog:
            key, ops, _ = backlog[0]
            if key not in self.created:
                self.arrived[key].add(rank)
                if not set(self.members(key)) <= self.arrived[key]:
                    return False
                self.created.add(key)
            backlog.popleft()
            self.moved = True
            if ops is not None:
                self.queues[(rank, key)].append(ops)
        return True

    # ----- running -------------------------------------------------------------
    def needs(self, rank: int, action: Action):
        schedule = self.schedule
        stage = schedule.stage_of(rank, action.chunk) if action.chunk >= 0 else -1
        if action.kind is ActionKind.F and stage > 0:
            producer, tag = stage - 1, "F"
        elif action.kind in (ActionKind.B, ActionKind.BW) and stage < schedule.num_stages - 1:
            producer, tag = stage + 1, "B"
        else:
            return None
        if schedule.locate(producer)[0] == rank:
            return None
        return self.recv_op[rank].get((tag, producer, action.microbatch), "missing")

    def advance(self, rank: int) -> None:
        actions = self.schedule.ranks[rank]
        while self.flush(rank) and self.pointer[rank] < len(actions):
            action = actions[self.pointer[rank]]
            if action.kind in COMM_KINDS:
                self.pointer[rank] = self.issue(rank, self.pointer[rank])
                self.moved = True
                continue
            op = self.needs(rank, action)
            if op == "missing":
                raise ScheduleError(f"{_where(rank, self.pointer[rank], action)}: no RECV "
                                    "of its input was issued before it")
            if op is not None and not op[3]:
                break
            self.pointer[rank] += 1
            self.moved = True

    def match(self) -> None:
        for (rank, key), entries in list(self.queues.items()):
            if not entries:
                continue
            for op in entries[0]:
                if not op[0] or op[3]:
                    continue
                other = self.queues.get((op[1], key))
                if not other:
                    continue
                recv = next((o for o in other[0] if not o[0] and not o[3] and o[1] == rank),
                            None)
                if recv is None:
                    continue
                if recv[2] != op[2]:
                    raise ScheduleError(
                        f"{_where(*recv[4])} would receive {op[2][0]} of stage "
                        f"{op[2][1]} microbatch {op[2][2]} sent by {_where(*op[4])} "
                        f"(NCCL matches in order on communicator {key})")
                op[3] = recv[3] = True
                self.sends_open[rank] -= 1
                self.moved = True
        for entries in self.queues.values():
            while entries and all(o[3] for o in entries[0]):
                entries.pop(0)
                self.moved = True

    def run(self) -> None:
        self.moved = True
        while self.moved:
            self.moved = False
            for rank in range(self.schedule.pp):
                self.advance(rank)
            self.match()
        stuck = [r for r in range(self.schedule.pp)
                 if self.pointer[r] < len(self.schedule.ranks[r]) or self.sends_open[r]
                 or self.backlog[r]]
        if stuck:
            raise ScheduleError(f"deadlock under NCCL semantics ({self.layout.value} "
                                "channels): " + " | ".join(map(self.explain, stuck)))

    def explain(self, rank: int) -> str:
        actions = self.schedule.ranks[rank]
        if self.backlog[rank]:
            key, _, where = self.backlog[rank][0]
            missing = sorted(set(self.members(key)) - self.arrived[key])
            what = (f"{where} blocks in the first operation on communicator {key}, whose "
                    f"creation waits for rank(s) {missing}")
        elif self.pointer[rank] < len(actions):
            what = (f"{_where(rank, self.pointer[rank], actions[self.pointer[rank]])} "
                    "waits for its RECV")
        else:
            what = f"rank {rank} end waits for its sends"
        heads = [f"{key}: {', '.join(_where(*o[4]) for o in entries[0])}"
                 for (r, key), entries in self.queues.items() if r == rank and entries]
        return f"{what}; queue heads {'; '.join(heads) or 'none'}"
