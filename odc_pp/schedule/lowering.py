"""Lowering passes: compute-only schedule -> schedule the runtime executes.

Each pass is a pure function ``Schedule -> new Schedule``; ``lower`` chains them.

* ``lower_communication`` adds SEND_F/RECV_F/SEND_B/RECV_B between ranks;
* ``insert_offload`` adds OFFLOAD/RELOAD of saved activations (PipeOffload);
* ``insert_post_validation`` marks where each rank's optimizer may step eagerly;
* ``forward_only`` keeps a compute-only schedule's forwards (evaluation): each rank's F
  in the training order, which stays deadlock-free (dropping actions removes waits).
"""

from __future__ import annotations

import bisect

from .costs import CostModel
from .ir import COMM_KINDS, COMPUTE_KINDS, Action, ActionKind, Schedule

__all__ = ["lower", "lower_communication", "insert_offload", "insert_post_validation",
           "forward_only"]

_BACKWARD = (ActionKind.B, ActionKind.BW)


def _message_of(schedule: Schedule, action: Action):
    """(send kind, recv kind, dst rank, consumer chunk) for a compute action whose output
    crosses ranks, else None."""
    stage = schedule.stage_of(action.rank, action.chunk)
    if action.kind is ActionKind.F and stage < schedule.num_stages - 1:
        dst, chunk = schedule.locate(stage + 1)
        if dst != action.rank:
            return ActionKind.SEND_F, ActionKind.RECV_F, dst, chunk
    if action.kind in _BACKWARD and stage > 0:
        dst, chunk = schedule.locate(stage - 1)
        if dst != action.rank:
            return ActionKind.SEND_B, ActionKind.RECV_B, dst, chunk
    return None


def lower_communication(schedule: Schedule, *, recv_lookahead: int = 1) -> Schedule:
    """Insert explicit point-to-point communication; the contract the runtime relies on:

    * a SEND (SEND_F after an F, SEND_B after a B/BW) comes right after the compute that
      produces the tensor; nothing is sent when both stages sit on the same rank (the
      turn of a V);
    * a RECV comes before the compute that consumes it. The runtime posts RECVs as
      non-blocking receives and waits only at the consumer, so a RECV is hoisted
      ``recv_lookahead`` compute actions ahead of its consumer (the transfer overlaps
      that compute), and further up when needed for the next rule;
    * for every ordered rank pair (src -> dst), the RECVs on dst appear in exactly the
      order of the SENDs on src (NCCL matches point-to-point operations in order);
    * hence waits happen only at consumers, on tensors whose producers come earlier in
      a deadlock-free compute order: the result never deadlocks if the compute-only
      schedule does not (``validate`` checks both).
    """
    if any(a.kind in COMM_KINDS for a in schedule.actions()):
        raise ValueError(f"schedule {schedule.name!r} already has communication actions; "
                         "lower_communication expects a compute-only schedule")
    if recv_lookahead < 0:
        raise ValueError(f"recv_lookahead must be >= 0, got {recv_lookahead}")
    sends, pairs = _messages(schedule, _consumer_positions(schedule))
    inserts = _recv_slots(schedule, pairs, recv_lookahead)
    lowered = schedule.copy(ranks=[[] for _ in range(schedule.pp)])
    for rank, actions in enumerate(schedule.ranks):
        out = lowered.ranks[rank]
        for index, action in enumerate(actions):
            out.extend(recv for _, _, recv in sorted(inserts[rank].get(index, []),
                                                     key=lambda item: item[:2]))
            out.append(action)
            if (rank, index) in sends:
                out.append(sends[(rank, index)])
    return lowered


def _consumer_positions(schedule: Schedule) -> dict[tuple[int, str, int, int], int]:
    """(rank, "F" or "B", chunk, microbatch) -> index of that compute in the rank's list."""
    position = {}
    for rank, actions in enumerate(schedule.ranks):
        for index, action in enumerate(actions):
            group = "F" if action.kind is ActionKind.F else (
                "B" if action.kind in _BACKWARD else None)
            if group:
                position[(rank, group, action.chunk, action.microbatch)] = index
    return position


def _messages(schedule: Schedule, position: dict
              ) -> tuple[dict[tuple[int, int], Action],
                         dict[tuple[int, int], list[tuple[int, Action]]]]:
    """The SEND after each producing compute, keyed (rank, index), and per ordered rank
    pair the (consumer index, RECV) of every message, in send order."""
    pairs: dict[tuple[int, int], list[tuple[int, Action]]] = {}
    sends: dict[tuple[int, int], Action] = {}
    for rank, actions in enumerate(schedule.ranks):
        for index, action in enumerate(actions):
            message = _message_of(schedule, action)
            if message is None:
                continue
            send_kind, recv_kind, dst, chunk = message
            sends[(rank, index)] = Action(rank=rank, kind=send_kind, chunk=action.chunk,
                                          microbatch=action.microbatch, peer=dst)
            group = "F" if send_kind is ActionKind.SEND_F else "B"
            consumer = position.get((dst, group, chunk, action.microbatch))
            if consumer is None:
                raise ValueError(f"{action.short()} on rank {rank} sends to rank {dst}, "
                                 f"which has no consumer {group}{chunk}.{action.microbatch}")
            recv = Action(rank=dst, kind=recv_kind, chunk=chunk,
                          microbatch=action.microbatch, peer=rank)
            pairs.setdefault((rank, dst), []).append((consumer, recv))
    return sends, pairs


def _recv_slots(schedule: Schedule, pairs: dict, lookahead: int
                ) -> list[dict[int, list[tuple[int, int, Action]]]]:
    """Per rank, index -> the RECVs to insert before it, as (order, src, RECV): each
    hoisted ``lookahead`` computes ahead of its consumer, and never after a later
    message's RECV from the same sender."""
    compute_index = [[i for i, a in enumerate(actions) if a.kind in COMPUTE_KINDS]
                     for actions in schedule.ranks]
    inserts: list[dict[int, list[tuple[int, int, Action]]]] = [{} for _ in schedule.ranks]
    for (src, dst), messages in pairs.items():
        later = None
        placed = []
        for consumer, recv in reversed(messages):
            slot = _hoisted_slot(compute_index[dst], consumer, lookahead)
            if later is not None:
                slot = min(slot, later)
            later = slot
            placed.append((slot, recv))
        for seq, (slot, recv) in enumerate(reversed(placed)):
            inserts[dst].setdefault(slot, []).append((seq, src, recv))
    return inserts


def _hoisted_slot(compute_positions: list[int], consumer: int, lookahead: int) -> int:
    """Index of the action the RECV is inserted before: ``lookahead`` computes earlier."""
    at = bisect.bisect_left(compute_positions, consumer)
    return compute_positions[max(at - lookahead, 0)] if compute_positions else consumer


def insert_offload(schedule: Schedule, costs: CostModel,
                   offload_chunks: list[int] | None = None, *,
                   selective: bool = False) -> Schedule:
    """Offload the saved activations of ``offload_chunks`` (default
    ``schedule.meta["offload_chunks"]``) to host memory and reload them for backward.

    Policy: OFFLOAD(c, i) is issued right after F(c, i) (after the SEND_F that follows it,
    if lowered). Using the simulated timing of the input schedule, RELOAD(c, i) is issued
    before the latest compute action that starts at least ``2 / offload_bandwidth`` before
    B(c, i) (room for one transfer still queued on the rank's FIFO host link plus the
    reload itself), so the reload hides behind compute when the activation lives long
    enough; when it does not, the RELOAD directly follows the OFFLOAD (correct, but the
    backward waits). Memory counts ``-mem_f`` at OFFLOAD and ``+mem_f`` at RELOAD.

    ``selective`` (PipeOffload's selective offload): a (chunk, microbatch) pass of an
    offloaded chunk is offloaded only when its activations live (F end to backward start,
    simulated) at least ``2 / offload_bandwidth``, long enough to hide the offload and the
    reload; the shorter-lived passes keep their activations on the device
    (``meta["offload_skipped"]``: their [rank, chunk, microbatch]).
    """
    chunks = list(schedule.meta.get("offload_chunks", []) if offload_chunks is None
                  else offload_chunks)
    bad = [c for c in chunks if not 0 <= c < schedule.num_chunks]
    if bad:
        raise ValueError(f"offload_chunks {bad} outside 0..{schedule.num_chunks - 1}")
    if any(a.kind in (ActionKind.OFFLOAD, ActionKind.RELOAD) for a in schedule.actions()):
        raise ValueError(f"schedule {schedule.name!r} already has OFFLOAD/RELOAD actions")
    result = schedule.copy()
    result.meta["offload_chunks"] = sorted(set(chunks))
    if not chunks:
        return result
    lead = 2 * costs.offload_time  # ValueError if costs has no offload bandwidth
    from .simulator import simulate  # lazy: keeps lowering importable on its own

    timing = simulate(schedule, costs)
    wanted = set(chunks)
    if not selective:
        return _offloaded(schedule, result, timing, lead, wanted, set())
    from .offload_select import skipped_passes

    skipped = skipped_passes(schedule, costs, wanted, timing, lambda skip: _offloaded(
        schedule, schedule.copy(), timing, lead, wanted, skip))
    result.meta["offload_skipped"] = [list(item) for item in sorted(skipped)]
    return _offloaded(schedule, result, timing, lead, wanted, skipped)


def _offloaded(schedule: Schedule, result: Schedule, timing, lead: float, wanted: set[int],
               skipped: set[tuple[int, int, int]]) -> Schedule:
    """``result`` (a copy of ``schedule``) with the OFFLOAD/RELOAD of every pass of
    ``wanted`` but the ``skipped`` (rank, chunk, microbatch), placed as
    :func:`insert_offload` says under the compute ``timing``."""
    def offloads(action: Action) -> bool:
        return action.chunk in wanted and \
            (action.rank, action.chunk, action.microbatch) not in skipped
    for rank, actions in enumerate(schedule.ranks):
        out: list[Action] = []
        reload_before: dict[int, list[Action]] = {}
        forward_at = {(a.chunk, a.microbatch): i for i, a in enumerate(actions)
                      if a.kind is ActionKind.F}
        for index, action in enumerate(actions):
            if action.kind in _BACKWARD and offloads(action):
                slot = _reload_slot(actions, index, timing.start, lead, action,
                                    forward_at[(action.chunk, action.microbatch)])
                reload_before.setdefault(slot, []).append(
                    Action(rank=rank, kind=ActionKind.RELOAD, chunk=action.chunk,
                           microbatch=action.microbatch))
        pending_offload: Action | None = None
        for index, action in enumerate(actions):
            if pending_offload is not None and action.kind not in (ActionKind.SEND_F,):
                out.append(pending_offload)
                pending_offload = None
            out.extend(reload_before.get(index, []))
            out.append(action)
            if action.kind is ActionKind.F and offloads(action):
                pending_offload = Action(rank=rank, kind=ActionKind.OFFLOAD,
                                         chunk=action.chunk, microbatch=action.microbatch)
        if pending_offload is not None:
            out.append(pending_offload)
        result.ranks[rank] = out
    return result


def _reload_slot(actions: list[Action], backward_index: int, start: dict, lead: float,
                 backward: Action, forward_index: int) -> int:
    """Index of the action RELOAD(backward) goes before (see insert_offload);
    ``forward_index``: where the backward's F is in ``actions``."""
    deadline = start[backward] - lead
    for index in range(backward_index, forward_index, -1):
        action = actions[index]
        if action.kind in COMPUTE_KINDS and start[action] <= deadline + 1e-9:
            return index
    # too short a lifespan: reload right after the offload (first compute after the F)
    return next((i for i in range(forward_index + 1, backward_index + 1)
                 if actions[i].kind in COMPUTE_KINDS), backward_index)


def insert_post_validation(schedule: Schedule) -> Schedule:
    """One POST_VALIDATION (chunk = microbatch = -1) per rank, right after the rank's last
    gradient computation (B, BW or W) and the sends that directly follow it: from there
    on the rank's gradients are final, so its optimizer may step eagerly and validate
    (global norm / NaN check) afterwards."""
    if any(a.kind is ActionKind.POST_VALIDATION for a in schedule.actions()):
        raise ValueError(f"schedule {schedule.name!r} already has POST_VALIDATION actions")
    result = schedule.copy()
    for rank, actions in enumerate(schedule.ranks):
        last = max((i for i, a in enumerate(actions)
                    if a.kind in (ActionKind.B, ActionKind.BW, ActionKind.W)), default=-1)
        at = last + 1
        while at < len(actions) and actions[at].kind in (ActionKind.SEND_B, ActionKind.SEND_F):
            at += 1
        marker = Action(rank=rank, kind=ActionKind.POST_VALIDATION, chunk=-1, microbatch=-1)
        result.ranks[rank] = actions[:at] + [marker] + actions[at:]
    return result


def forward_only(schedule: Schedule) -> Schedule:
    """The forward pass of a compute-only ``schedule``: every rank's F actions in its
    order, nothing else (lower it with :func:`lower_communication`)."""
    if any(a.kind in COMM_KINDS for a in schedule.actions()):
        raise ValueError(f"schedule {schedule.name!r} already has communication actions; "
                         "forward_only expects a compute-only schedule")
    return Schedule(name=f"{schedule.name}-forward", pp=schedule.pp,
                    num_microbatches=schedule.num_microbatches,
                    num_chunks=schedule.num_chunks, placement=schedule.placement,
                    ranks=[[a for a in actions if a.kind is ActionKind.F]
                           for actions in schedule.ranks],
                    meta={"forward_only": True})


def lower(schedule: Schedule, costs: CostModel | None = None, *, communication: bool = True,
          offload: list[int] | bool | None = None, post_validation: bool = False,
          selective_offload: bool = False) -> Schedule:
    """Chain the passes: offload (None: ``meta["offload_chunks"]`` if any; False: none;
    a list: those chunks; ``selective_offload``: skip the passes too short-lived to hide,
    see :func:`insert_offload`), then communication, then post-validation."""
    costs = CostModel() if costs is None else costs
    chunks: list[int]
    if offload is None:
        chunks = list(schedule.meta.get("offload_chunks", []))
    elif offload is False:
        chunks = []
    elif offload is True:
        raise ValueError("offload=True is ambiguous: pass a list of chunks, or None to use "
                         "schedule.meta['offload_chunks']")
    else:
        chunks = list(offload)
    result = insert_offload(schedule, costs, chunks, selective=selective_offload) \
        if chunks else schedule
    if communication:
        result = lower_communication(result)
    if post_validation:
        result = insert_post_validation(result)
    return result
