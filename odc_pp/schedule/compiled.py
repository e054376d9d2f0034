"""A schedule compiled for the simulator: integer keys, dependencies and their static
checks, which do not depend on the costs.

``compile_schedule(schedule)`` does this work once; ``simulate(compiled, costs)`` then
only assigns durations. Searches that time one schedule under many cost models (the
planner: one simulation per replica and candidate) compile it once. A compiled schedule
is a snapshot: the schedule must not change afterwards.
"""

from __future__ import annotations

from .costs import CostModel
from .ir import ActionKind, Schedule

__all__ = ["CompiledSchedule", "compile_schedule", "DependencyError"]

# operation codes of compiled actions
_COMPUTE, _SEND, _RECV, _OFFLOAD, _RELOAD, _MARK = range(6)
# key tags: a key is the int ((tag * num_stages) + virtual stage) * mb_span + microbatch
_KF, _KB, _KW, _KSF, _KSB, _KRF, _KRB, _KOF, _KRL = range(9)
_TAG_OF_KIND = {
    ActionKind.F: _KF, ActionKind.B: _KB, ActionKind.BW: _KB, ActionKind.W: _KW,
    ActionKind.SEND_F: _KSF, ActionKind.SEND_B: _KSB, ActionKind.RECV_F: _KRF,
    ActionKind.RECV_B: _KRB, ActionKind.OFFLOAD: _KOF, ActionKind.RELOAD: _KRL,
}
_CODE_OF_KIND = {
    ActionKind.F: _COMPUTE, ActionKind.B: _COMPUTE, ActionKind.BW: _COMPUTE,
    ActionKind.W: _COMPUTE, ActionKind.SEND_F: _SEND, ActionKind.SEND_B: _SEND,
    ActionKind.RECV_F: _RECV, ActionKind.RECV_B: _RECV, ActionKind.OFFLOAD: _OFFLOAD,
    ActionKind.RELOAD: _RELOAD, ActionKind.POST_VALIDATION: _MARK,
}


class DependencyError(ValueError):
    """An action depends on something the schedule lacks or orders after it."""


class CompiledSchedule:
    """Per rank, one entry per action: ``(code, key, deps, kind, stage, microbatch)``;
    ``deps`` is a tuple of ``(key, crosses)`` where ``crosses`` marks an implicit transfer
    between ranks (it costs ``t_comm``). Static dependency checks happen here."""

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule
        self.actions = [list(actions) for actions in schedule.ranks]
        """The actions per rank as compiled (results share this list)."""
        self.pp = schedule.pp
        self.num_stages = schedule.num_stages
        self.stage = [[schedule.stage_of(r, c) for c in range(schedule.num_chunks)]
                      for r in range(schedule.pp)]
        self.rank_of = [schedule.locate(s)[0] for s in range(self.num_stages)]
        mbs = [a.microbatch for a in schedule.actions()]
        self.mb_span = max(mbs, default=0) + 1
        self.where: dict[int, tuple[int, int]] = {}
        self.keys = self._index()
        self.entries = self._entries()
        self.slots, self.timed = self._slots()

    def key(self, tag: int, stage: int, mb: int) -> int:
        return (tag * self.num_stages + stage) * self.mb_span + mb

    def decode(self, key: int) -> tuple[int, int, int]:
        rest, mb = divmod(key, self.mb_span)
        tag, stage = divmod(rest, self.num_stages)
        return tag, stage, mb

    def describe(self, key: int) -> str:
        tag, stage, mb = self.decode(key)
        if not 0 <= stage < self.num_stages:
            return f"stage {stage} (outside the pipeline)"
        rank, chunk = self.schedule.locate(stage)
        kind = {_KF: "F", _KB: "B/BW", _KW: "W", _KSF: "SEND_F", _KSB: "SEND_B",
                _KRF: "RECV_F", _KRB: "RECV_B", _KOF: "OFFLOAD", _KRL: "RELOAD"}[tag]
        return f"{kind}{chunk}.{mb} (stage {stage}) on rank {rank}"

    def ops(self, costs: CostModel) -> list[list[tuple]]:
        """Per rank, ``(code, key, deps, duration, mem_delta)`` under ``costs``; ``deps``
        as in the entries (a crossing dependency adds ``costs.t_comm``)."""
        durations, deltas = [0.0], [0.0]  # slot 0: no time, no memory
        for kind, stage, rank in self.slots[1:]:
            if kind is None:
                durations.append(costs.offload_time)
                deltas.append(0.0)
            else:
                durations.append(costs.compute_time(kind, stage=stage, rank=rank, pp=self.pp,
                                                    num_stages=self.num_stages))
                deltas.append(costs.memory_delta(kind))
        scale = costs.microbatch_scale
        if scale is None:
            scale = [1.0] * (self.mb_span + 1)
        else:
            if len(scale) < self.mb_span:
                costs.scale_of(self.mb_span - 1)  # raises: a microbatch without a scale
            scale = list(scale[:self.mb_span]) + [1.0]  # [-1]: actions without a scale
        return [[(code, key, deps, durations[slot] * scale[mb], deltas[slot])
                 for code, key, deps, slot, mb in entries] for entries in self.timed]

    def _index(self) -> list[list[int | None]]:
        keys = []
        num_chunks = self.schedule.num_chunks
        for rank, actions in enumerate(self.schedule.ranks):
            rank_keys: list[int | None] = []
            stage_of_chunk = self.stage[rank]
            for pos, action in enumerate(actions):
                if action.rank != rank:
                    raise DependencyError(f"{action.short()} says rank {action.rank} but is "
                                          f"in rank {rank}'s list")
                if action.kind is ActionKind.POST_VALIDATION:
                    rank_keys.append(None)
                    continue
                if not 0 <= action.chunk < num_chunks or action.microbatch < 0:
                    raise DependencyError(f"{action.short()} on rank {rank}: chunk or "
                                          f"microbatch out of range")
                key = self.key(_TAG_OF_KIND[action.kind], stage_of_chunk[action.chunk],
                               action.microbatch)
                if key in self.where:
                    other = self.where[key]
                    raise DependencyError(f"{action.short()} on rank {rank} position {pos} "
                                          f"duplicates rank {other[0]} position {other[1]}")
                self.where[key] = (rank, pos)
                rank_keys.append(key)
            keys.append(rank_keys)
        return keys

    def _entries(self) -> list[list[tuple]]:
        where = self.where
        plan = []
        for rank, actions in enumerate(self.schedule.ranks):
            entries = []
            for pos, action in enumerate(actions):
                key = self.keys[rank][pos]
                code = _CODE_OF_KIND[action.kind]
                if key is None:
                    entries.append((_MARK, -1 - pos, (), action.kind, -1, -1))
                    continue
                deps = self._deps_of(rank, key)
                for dep_key, _ in deps:
                    found = where.get(dep_key)
                    if found is None or (found[0] == rank and found[1] > pos) or (
                            action.kind is ActionKind.W):
                        self._check_dep(action, rank, pos, dep_key)
                entries.append((code, key, deps, action.kind,
                                self.stage[rank][action.chunk], action.microbatch))
            plan.append(entries)
        return plan

    def _slots(self) -> tuple[list, list[list[tuple]]]:
        """The distinct (kind, stage, first rank) of the compute entries (None: the host
        link), and per rank ``(code, key, deps, slot, microbatch or -1)``."""
        slots: list = [None]
        index: dict = {}
        timed = []
        for rank, entries in enumerate(self.entries):
            rank_timed = []
            for code, key, deps, kind, stage, mb in entries:
                if code == _COMPUTE:
                    slot = index.get((kind, stage))
                    if slot is None:
                        slot = index[(kind, stage)] = len(slots)
                        slots.append((kind, stage, rank))
                    rank_timed.append((code, key, deps, slot, mb))
                elif code == _OFFLOAD or code == _RELOAD:
                    slot = index.get(None)
                    if slot is None:
                        slot = index[None] = len(slots)
                        slots.append((None, -1, rank))
                    rank_timed.append((code, key, deps, slot, -1))
                else:
                    rank_timed.append((code, key, deps, 0, -1))
            timed.append(rank_timed)
        return slots, timed

    def _deps_of(self, rank: int, key: int) -> tuple:
        tag, stage, mb = self.decode(key)
        k = self.key
        if tag == _KF:
            if stage == 0:
                return ()
            return (self._input_dep(rank, stage - 1, mb, _KF, _KRF, stage),)
        if tag == _KB:
            deps: tuple = ((k(_KF, stage, mb), False),)
            if stage < self.num_stages - 1:
                deps += (self._input_dep(rank, stage + 1, mb, _KB, _KRB, stage),)
            if k(_KOF, stage, mb) in self.where:
                deps += ((k(_KRL, stage, mb), False),)
            return deps
        if tag == _KW:
            return ((k(_KB, stage, mb), False),)
        if tag == _KSF or tag == _KOF:
            return ((k(_KF, stage, mb), False),)
        if tag == _KSB:
            return ((k(_KB, stage, mb), False),)
        if tag == _KRF:
            return ((k(_KSF, stage - 1, mb), True),) if stage > 0 else ((-1, False),)
        if tag == _KRB:
            return (((k(_KSB, stage + 1, mb), True),) if stage < self.num_stages - 1
                    else ((-1, False),))
        if tag == _KRL:
            return ((k(_KOF, stage, mb), False),)
        raise AssertionError(tag)

    def _input_dep(self, rank, producer_stage, mb, tag, recv_tag, stage):
        if self.rank_of[producer_stage] == rank:
            return (self.key(tag, producer_stage, mb), False)
        recv = self.key(recv_tag, stage, mb)
        if recv in self.where:
            return (recv, False)
        return (self.key(tag, producer_stage, mb), True)

    def _check_dep(self, action, rank, pos, dep_key) -> None:
        found = self.where.get(dep_key)
        if found is None:
            if dep_key < 0:
                raise DependencyError(f"{action.short()} on rank {rank} position {pos} has "
                                      f"no neighbouring stage to pair with")
            hint = ""
            if action.kind is ActionKind.W:
                hint = " (a W needs a split B, not a fused BW)"
            raise DependencyError(f"{action.short()} on rank {rank} position {pos} needs "
                                  f"{self.describe(dep_key)}, which the schedule lacks{hint}")
        dep_rank, dep_pos = found
        if dep_rank == rank and dep_pos > pos:
            raise DependencyError(f"{action.short()} on rank {rank} position {pos} needs "
                                  f"{self.describe(dep_key)}, which comes later "
                                  f"(position {dep_pos}) on the same rank")
        if action.kind is ActionKind.W and \
                self.schedule.ranks[dep_rank][dep_pos].kind is ActionKind.BW:
            raise DependencyError(f"{action.short()} on rank {rank} follows a fused BW of "
                                  f"the same microbatch: the weight gradient is done twice")


def compile_schedule(schedule: Schedule | CompiledSchedule) -> CompiledSchedule:
    """``schedule`` compiled (a CompiledSchedule is returned as it is)."""
    if isinstance(schedule, CompiledSchedule):
        return schedule
    return CompiledSchedule(schedule)
