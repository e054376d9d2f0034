"""Static checks of a schedule: coverage, local order, communication, deadlock, memory.

``validate`` raises ``ScheduleError`` (a ValueError) naming the offending action as
``rank R position P (F0.3)``. Checks, in order:

1. every action sits in its own rank's list, with chunk/microbatch/peer in range;
2. every (chunk, microbatch) of every rank has exactly one F and either one B and one W
   or one BW (the placement decides which stage a (rank, chunk) runs);
3. per rank: F before B/BW before W; OFFLOAD after its F, RELOAD after its OFFLOAD and
   before the backward; at most one POST_VALIDATION, after all gradient work;
4. lowered schedules (any SEND/RECV present): every cross-rank dependency has exactly
   one SEND after its producer and one matching RECV (right peer) before its consumer,
   none between stages on the same rank, and for each ordered rank pair the RECVs come
   in the order of the SENDs;
5. progress: running every rank's list in order, with a compute waiting for its
   cross-rank inputs (their producer, or the SEND when lowered; RECVs never block),
   every action eventually runs (no cycle, so no deadlock);
6. memory, when ``memory_limit`` is given: the running sum of activation deltas per rank
   in list order (``costs``' deltas, OFFLOAD ``-mem_f``, RELOAD ``+mem_f``) never exceeds
   the limit;
7. NCCL order, when ``nccl_layout`` is given (lowered schedules): :func:`check_nccl_order`
   (:mod:`odc_pp.schedule.nccl_order`) replays what the runtime issues under NCCL
   semantics on that communicator layout: creation rendezvous (after the start-up
   warm-up), FIFO per communicator, rendezvous sends.
"""

from __future__ import annotations

from collections import defaultdict

from .checks import ScheduleError, message_route
from .checks import where as _where
from .costs import CostModel
from .ir import COMM_KINDS, COMPUTE_KINDS, Action, ActionKind, Schedule
from .nccl_order import check_nccl_order

__all__ = ["ScheduleError", "validate", "check_nccl_order", "peak_memory", "memory_profile"]

_BACKWARD = (ActionKind.B, ActionKind.BW)
_EPS = 1e-9


def validate(schedule: Schedule, costs: CostModel | None = None,
             memory_limit: float | None = None, *, nccl_layout=None) -> None:
    """Raise ScheduleError unless ``schedule`` passes every check in the module doc.
    ``nccl_layout``: a :class:`odc_pp.schedule.channels.ChannelLayout` to also check
    the lowered order under NCCL semantics on it."""
    _check_fields(schedule)
    _check_coverage(schedule)
    _check_local_order(schedule)
    lowered = any(a.kind in COMM_KINDS for a in schedule.actions())
    if lowered:
        _check_communication(schedule)
    _check_progress(schedule, lowered)
    if memory_limit is not None:
        _check_memory(schedule, costs or CostModel(), memory_limit)
    if nccl_layout is not None and lowered:
        check_nccl_order(schedule, nccl_layout)


# ----- 1. fields --------------------------------------------------------------------
def _check_fields(schedule: Schedule) -> None:
    for rank, actions in enumerate(schedule.ranks):
        for position, action in enumerate(actions):
            where = _where(rank, position, action)
            if action.rank != rank:
                raise ScheduleError(f"{where}: action says rank {action.rank}")
            if action.kind is ActionKind.POST_VALIDATION:
                if (action.chunk, action.microbatch) != (-1, -1):
                    raise ScheduleError(f"{where}: POST_VALIDATION needs chunk=microbatch=-1")
                continue
            if not 0 <= action.chunk < schedule.num_chunks:
                raise ScheduleError(f"{where}: chunk outside 0..{schedule.num_chunks - 1}")
            if not 0 <= action.microbatch < schedule.num_microbatches:
                raise ScheduleError(f"{where}: microbatch outside "
                                    f"0..{schedule.num_microbatches - 1}")
            if action.kind in COMM_KINDS:
                if action.peer is None or not 0 <= action.peer < schedule.pp \
                        or action.peer == rank:
                    raise ScheduleError(f"{where}: peer {action.peer} is not another rank")
            elif action.peer is not None:
                raise ScheduleError(f"{where}: only SEND/RECV actions have a peer")


# ----- 2. coverage ------------------------------------------------------------------
def _check_coverage(schedule: Schedule) -> None:
    for rank, actions in enumerate(schedule.ranks):
        counts: dict[tuple[int, int], dict[ActionKind, int]] = defaultdict(
            lambda: defaultdict(int))
        first_at: dict[tuple[int, int, ActionKind], int] = {}
        for position, action in enumerate(actions):
            if action.kind in COMPUTE_KINDS:
                item = (action.chunk, action.microbatch)
                counts[item][action.kind] += 1
                if counts[item][action.kind] > 1:
                    raise ScheduleError(f"{_where(rank, position, action)}: duplicate "
                                        f"{action.kind.value} of this (chunk, microbatch)")
                first_at[(*item, action.kind)] = position
        for chunk in range(schedule.num_chunks):
            for mb in range(schedule.num_microbatches):
                seen = counts.get((chunk, mb), {})
                label = f"rank {rank} chunk {chunk} microbatch {mb}"
                if not seen.get(ActionKind.F):
                    raise ScheduleError(f"{label}: missing F")
                fused, b, w = (seen.get(ActionKind.BW, 0), seen.get(ActionKind.B, 0),
                               seen.get(ActionKind.W, 0))
                if fused and (b or w):
                    position = first_at[(chunk, mb, ActionKind.BW)]
                    raise ScheduleError(f"{_where(rank, position, actions[position])}: "
                                        f"fused BW together with a separate B or W")
                if not fused and not (b and w):
                    missing = "B and W (or a fused BW)" if not (b or w) else (
                        "W after its B" if b else "B before its W")
                    raise ScheduleError(f"{label}: missing {missing}")


# ----- 3. local order ---------------------------------------------------------------
def _check_local_order(schedule: Schedule) -> None:
    for rank, actions in enumerate(schedule.ranks):
        done: set[tuple[ActionKind, int, int]] = set()
        post_validation_at = None
        for position, action in enumerate(actions):
            where = _where(rank, position, action)
            kind, item = action.kind, (action.chunk, action.microbatch)
            if post_validation_at is not None and kind in (ActionKind.B, ActionKind.BW,
                                                           ActionKind.W):
                raise ScheduleError(f"{where}: gradient work after POST_VALIDATION "
                                    f"(position {post_validation_at})")
            if kind is ActionKind.POST_VALIDATION:
                if post_validation_at is not None:
                    raise ScheduleError(f"{where}: second POST_VALIDATION on the rank")
                post_validation_at = position
                continue
            needs = {ActionKind.B: [ActionKind.F], ActionKind.BW: [ActionKind.F],
                     ActionKind.W: [ActionKind.B], ActionKind.OFFLOAD: [ActionKind.F],
                     ActionKind.RELOAD: [ActionKind.OFFLOAD],
                     ActionKind.SEND_F: [ActionKind.F]}.get(kind, [])
            if kind is ActionKind.SEND_B and not any((k, *item) in done for k in _BACKWARD):
                raise ScheduleError(f"{where}: comes before the backward it sends")
            for need in needs:
                if (need, *item) not in done:
                    raise ScheduleError(f"{where}: comes before the {need.value} it needs")
            if kind in _BACKWARD and (ActionKind.OFFLOAD, *item) in done \
                    and (ActionKind.RELOAD, *item) not in done:
                raise ScheduleError(f"{where}: activations were offloaded and not reloaded")
            if kind is ActionKind.OFFLOAD and any((k, *item) in done for k in _BACKWARD):
                raise ScheduleError(f"{where}: offloads activations after their backward")
            done.add((kind, *item))


# ----- 4. communication -------------------------------------------------------------
def _check_communication(schedule: Schedule) -> None:
    sends: dict[tuple, tuple[int, int, Action]] = {}
    recvs: dict[tuple, tuple[int, int, Action]] = {}
    pair_sends: dict[tuple[int, int], list[tuple]] = defaultdict(list)
    pair_recvs: dict[tuple[int, int], list[tuple]] = defaultdict(list)
    for rank, actions in enumerate(schedule.ranks):
        for position, action in enumerate(actions):
            if action.kind not in COMM_KINDS:
                continue
            where = _where(rank, position, action)
            info = message_route(schedule, action)
            if info is None:
                raise ScheduleError(f"{where}: no stage on the other side of this transfer")
            message, src, dst, _ = info
            if src == dst:
                raise ScheduleError(f"{where}: both stages are on rank {src}; no transfer "
                                    f"is needed")
            sending = action.kind in (ActionKind.SEND_F, ActionKind.SEND_B)
            expected_peer = dst if sending else src
            if action.peer != expected_peer:
                raise ScheduleError(f"{where}: peer should be rank {expected_peer}")
            table = sends if sending else recvs
            if message in table:
                raise ScheduleError(f"{where}: duplicate transfer of this tensor")
            table[message] = (rank, position, action)
            (pair_sends if sending else pair_recvs)[(src, dst)].append(message)
    for message, (rank, position, action) in sends.items():
        if message not in recvs:
            raise ScheduleError(f"{_where(rank, position, action)}: no matching RECV on "
                                f"rank {action.peer}")
    for message, (rank, position, action) in recvs.items():
        if message not in sends:
            raise ScheduleError(f"{_where(rank, position, action)}: no matching SEND on "
                                f"rank {action.peer}")
    for pair, order in pair_sends.items():
        received = pair_recvs[pair]
        for sent, got in zip(order, received):
            if sent != got:
                rank, position, action = recvs[got]
                raise ScheduleError(f"{_where(rank, position, action)}: RECVs from rank "
                                    f"{pair[0]} are not in the order of its SENDs (expected "
                                    f"{sent[0]} of stage {sent[1]} microbatch {sent[2]})")
    _check_consumers_have_recvs(schedule, recvs)


def _check_consumers_have_recvs(schedule: Schedule, recvs: dict) -> None:
    for rank, actions in enumerate(schedule.ranks):
        posted = set()
        for position, action in enumerate(actions):
            if action.kind in (ActionKind.RECV_F, ActionKind.RECV_B):
                posted.add((action.kind, action.chunk, action.microbatch))
                continue
            if action.kind is ActionKind.F:
                recv_kind, other = ActionKind.RECV_F, schedule.prev_stage_rank(rank,
                                                                                action.chunk)
            elif action.kind in _BACKWARD:
                recv_kind, other = ActionKind.RECV_B, schedule.next_stage_rank(rank,
                                                                                action.chunk)
            else:
                continue
            if other is not None and other != rank and \
                    (recv_kind, action.chunk, action.microbatch) not in posted:
                raise ScheduleError(f"{_where(rank, position, action)}: its input from "
                                    f"rank {other} has no {recv_kind.value} before it")


# ----- 5. progress ------------------------------------------------------------------
def _check_progress(schedule: Schedule, lowered: bool) -> None:
    """Run all ranks in order; a blocked action waits on the key of what it needs."""
    pointer = [0] * schedule.pp
    done: set[tuple] = set()
    waiting: dict[tuple, list[int]] = defaultdict(list)
    blocked: dict[int, tuple] = {}
    work = list(range(schedule.pp))
    while work:
        rank = work.pop()
        actions = schedule.ranks[rank]
        while pointer[rank] < len(actions):
            action = actions[pointer[rank]]
            need = _blocking_need(schedule, action, lowered)
            if need is not None and need not in done:
                waiting[need].append(rank)
                blocked[rank] = need
                break
            blocked.pop(rank, None)
            pointer[rank] += 1
            key = _key(schedule, action)
            if key is not None:
                done.add(key)
                work.extend(waiting.pop(key, ()))
    stuck = [r for r in range(schedule.pp) if pointer[r] < len(schedule.ranks[r])]
    if stuck:
        lines = [f"{_where(r, pointer[r], schedule.ranks[r][pointer[r]])} waits for "
                 f"{_describe(schedule, blocked[r])}" for r in stuck]
        raise ScheduleError("schedule deadlocks (cyclic waits): " + "; ".join(lines))


def _key(schedule: Schedule, action: Action) -> tuple | None:
    if action.kind is ActionKind.POST_VALIDATION:
        return None
    stage = schedule.stage_of(action.rank, action.chunk)
    tag = {ActionKind.BW: "B", ActionKind.B: "B"}.get(action.kind, action.kind.value)
    return (tag, stage, action.microbatch)


def _blocking_need(schedule: Schedule, action: Action, lowered: bool) -> tuple | None:
    stage = schedule.stage_of(action.rank, action.chunk) if action.chunk >= 0 else -1
    mb = action.microbatch
    if action.kind is ActionKind.F and stage > 0:
        producer = stage - 1
    elif action.kind in _BACKWARD and stage < schedule.num_stages - 1:
        producer = stage + 1
    else:
        return None  # local dependencies are covered by the order check
    tag = "F" if action.kind is ActionKind.F else "B"
    if lowered and schedule.locate(producer)[0] != action.rank:
        return ("SEND_F" if tag == "F" else "SEND_B", producer, mb)
    return (tag, producer, mb)


def _describe(schedule: Schedule, key: tuple) -> str:
    tag, stage, mb = key
    rank, chunk = schedule.locate(stage)
    return f"{tag} of chunk {chunk} microbatch {mb} on rank {rank}"


# ----- 6. memory --------------------------------------------------------------------
def _delta(action: Action, costs: CostModel) -> float:
    if action.kind is ActionKind.OFFLOAD:
        return -costs.mem_f
    if action.kind is ActionKind.RELOAD:
        return costs.mem_f
    return costs.memory_delta(action.kind)


def memory_profile(schedule: Schedule, costs: CostModel | None = None) -> list[list[float]]:
    """Per rank: activation memory after each action, in list order."""
    costs = costs or CostModel()
    profiles = []
    for actions in schedule.ranks:
        memory, profile = 0.0, []
        for action in actions:
            memory += _delta(action, costs)
            profile.append(memory)
        profiles.append(profile)
    return profiles


def peak_memory(schedule: Schedule, costs: CostModel | None = None) -> list[float]:
    """Per-rank peak of the in-order running sum of activation deltas (0 if empty)."""
    return [max([0.0, *profile]) for profile in memory_profile(schedule, costs)]


def _check_memory(schedule: Schedule, costs: CostModel, memory_limit: float) -> None:
    for rank, profile in enumerate(memory_profile(schedule, costs)):
        for position, memory in enumerate(profile):
            if memory > memory_limit + _EPS:
                action = schedule.ranks[rank][position]
                raise ScheduleError(f"{_where(rank, position, action)}: activation memory "
                                    f"{memory:g} exceeds the limit {memory_limit:g}")
