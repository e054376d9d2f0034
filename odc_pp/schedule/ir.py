"""Schedule IR: a schedule is plain data, an ordered list of typed actions per pipeline rank.

Virtual stages are numbered 0 .. pp*num_chunks-1 in model order. A rank holds
``num_chunks`` model chunks; ``placement`` maps (rank, chunk) <-> stage (the arithmetic
is in ``odc_pp.schedule.placement``).

Communication actions name the *local* chunk whose tensor moves: ``SEND_F``
sends the output activation of (rank, chunk) to the rank of the next stage,
``RECV_F`` receives the input activation of (rank, chunk), ``SEND_B`` sends the
input gradient of (rank, chunk) to the rank of the previous stage, ``RECV_B``
receives the output gradient of (rank, chunk). ``peer`` is the other rank.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Iterable, Iterator

from . import placement as _placement
from .placement import Placement

__all__ = [
    "ActionKind",
    "Action",
    "Placement",
    "Schedule",
    "COMPUTE_KINDS",
    "COMM_KINDS",
    "OFFLOAD_KINDS",
    "REPORT_ONLY_META",
]


class ActionKind(str, Enum):
    F = "F"  # forward
    B = "B"  # backward for input gradients only
    W = "W"  # backward for weight gradients only
    BW = "BW"  # fused backward (input and weight gradients)
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"
    OFFLOAD = "OFFLOAD"  # saved activations of (chunk, microbatch) -> host memory
    RELOAD = "RELOAD"  # host memory -> compute device
    POST_VALIDATION = "POST_VALIDATION"  # optimizer post-validation point


COMPUTE_KINDS = frozenset({ActionKind.F, ActionKind.B, ActionKind.W, ActionKind.BW})
COMM_KINDS = frozenset(
    {ActionKind.SEND_F, ActionKind.RECV_F, ActionKind.SEND_B, ActionKind.RECV_B}
)
OFFLOAD_KINDS = frozenset({ActionKind.OFFLOAD, ActionKind.RELOAD})

REPORT_ONLY_META = frozenset({"search_seconds"})
"""``Schedule.meta`` keys that describe how a schedule was made (timings), not what
runs; ``Schedule.digest`` leaves them out."""

# torch.distributed.pipelining letters for compute actions.
_TO_TORCH = {ActionKind.F: "F", ActionKind.B: "I", ActionKind.W: "W", ActionKind.BW: "B"}
_FROM_TORCH = {letter: kind for kind, letter in _TO_TORCH.items()}


@dataclass(frozen=True, order=True)
class Action:
    """One step of one rank. ``chunk``/``microbatch`` are -1 for POST_VALIDATION."""

    rank: int
    kind: ActionKind
    chunk: int = 0
    microbatch: int = 0
    peer: int | None = None

    def __post_init__(self) -> None:
        if type(self.kind) is not ActionKind:
            object.__setattr__(self, "kind", ActionKind(self.kind))

    @property
    def is_compute(self) -> bool:
        return self.kind in COMPUTE_KINDS

    @property
    def is_comm(self) -> bool:
        return self.kind in COMM_KINDS

    def to_dict(self) -> dict:
        out = {"rank": self.rank, "kind": self.kind.value, "chunk": self.chunk,
               "microbatch": self.microbatch}
        if self.peer is not None:
            out["peer"] = self.peer
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "Action":
        return cls(rank=int(data["rank"]), kind=ActionKind(data["kind"]),
                   chunk=int(data.get("chunk", 0)), microbatch=int(data.get("microbatch", 0)),
                   peer=None if data.get("peer") is None else int(data["peer"]))

    def short(self) -> str:
        """Compact label, e.g. ``F0.3`` (kind, chunk, microbatch)."""
        if self.kind is ActionKind.POST_VALIDATION:
            return "PV"
        return f"{self.kind.value}{self.chunk}.{self.microbatch}"


@dataclass
class Schedule:
    """Per-rank ordered action lists plus the shape they were made for."""

    name: str
    pp: int
    num_microbatches: int
    num_chunks: int = 1
    placement: Placement = Placement.INTERLEAVED
    ranks: list[list[Action]] = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.placement = Placement(self.placement)
        if not self.ranks:
            self.ranks = [[] for _ in range(self.pp)]
        if len(self.ranks) != self.pp:
            raise ValueError(f"schedule has {len(self.ranks)} rank lists for pp={self.pp}")

    # ----- placement -------------------------------------------------------------
    @property
    def num_stages(self) -> int:
        return _placement.num_stages(self.pp, self.num_chunks)

    def stage_of(self, rank: int, chunk: int) -> int:
        return _placement.stage_of(self.placement, self.pp, rank, chunk)

    def locate(self, stage: int) -> tuple[int, int]:
        """(rank, chunk) that runs virtual ``stage``."""
        return _placement.locate(self.placement, self.pp, self.num_chunks, stage)

    def next_stage_rank(self, rank: int, chunk: int) -> int | None:
        stage = self.stage_of(rank, chunk)
        return None if stage == self.num_stages - 1 else self.locate(stage + 1)[0]

    def prev_stage_rank(self, rank: int, chunk: int) -> int | None:
        stage = self.stage_of(rank, chunk)
        return None if stage == 0 else self.locate(stage - 1)[0]

    # ----- access ----------------------------------------------------------------
    def actions(self) -> Iterator[Action]:
        for rank_actions in self.ranks:
            yield from rank_actions

    def compute_actions(self, rank: int) -> list[Action]:
        return [a for a in self.ranks[rank] if a.is_compute]

    def append(self, action: Action) -> None:
        self.ranks[action.rank].append(action)

    def extend(self, actions: Iterable[Action]) -> None:
        for action in actions:
            self.append(action)

    def copy(self, **changes) -> "Schedule":
        data = dict(name=self.name, pp=self.pp, num_microbatches=self.num_microbatches,
                    num_chunks=self.num_chunks, placement=self.placement,
                    ranks=[list(r) for r in self.ranks], meta=dict(self.meta))
        data.update(changes)
        return Schedule(**data)

    # ----- JSON ------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"name": self.name, "pp": self.pp, "num_microbatches": self.num_microbatches,
                "num_chunks": self.num_chunks, "placement": self.placement.value,
                "meta": self.meta,
                "ranks": [[a.to_dict() for a in rank_actions] for rank_actions in self.ranks]}

    @classmethod
    def from_dict(cls, data: dict) -> "Schedule":
        return cls(name=data["name"], pp=int(data["pp"]),
                   num_microbatches=int(data["num_microbatches"]),
                   num_chunks=int(data.get("num_chunks", 1)),
                   placement=Placement(data.get("placement", "interleaved")),
                   meta=dict(data.get("meta", {})),
                   ranks=[[Action.from_dict(a) for a in r] for r in data["ranks"]])

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_json(cls, text: str) -> "Schedule":
        return cls.from_dict(json.loads(text))

    def digest(self) -> str:
        """sha256 of the canonical JSON (sorted keys, no whitespace) of everything ranks
        must agree on: shape, placement, every rank's actions and ``meta`` except the
        report-only keys in ``REPORT_ONLY_META`` (e.g. how long a search took)."""
        data = self.to_dict()
        data["meta"] = {k: v for k, v in data["meta"].items() if k not in REPORT_ONLY_META}
        text = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    # ----- torch.distributed.pipelining CSV ---------------------------------------
    def to_pipelining_csv(self) -> str:
        """Compute actions in torch.distributed.pipelining's CSV format.

        One row per rank; each cell is ``{stage}{letter}{microbatch}`` with
        letters F, I (input grad), W (weight grad), B (full backward), as read by
        ``PipelineScheduleMulti._load_csv(..., format="compute_only")``.
        """
        buf = io.StringIO()
        writer = csv.writer(buf)
        for rank in range(self.pp):
            writer.writerow(
                f"{self.stage_of(a.rank, a.chunk)}{_TO_TORCH[a.kind]}{a.microbatch}"
                for a in self.compute_actions(rank))
        return buf.getvalue()

    @classmethod
    def from_pipelining_csv(cls, text: str, *, name: str, num_chunks: int = 1,
                            placement: Placement = Placement.INTERLEAVED) -> "Schedule":
        rows = [row for row in csv.reader(io.StringIO(text))]
        pp = len(rows)
        schedule = cls(name=name, pp=pp, num_microbatches=0, num_chunks=num_chunks,
                       placement=placement)
        max_mb = -1
        for rank, row in enumerate(rows):
            for cell in row:
                cell = cell.strip()
                if not cell:
                    continue
                action = _parse_torch_cell(cell, schedule, rank)
                max_mb = max(max_mb, action.microbatch)
                schedule.append(action)
        schedule.num_microbatches = max_mb + 1
        return schedule


def _parse_torch_cell(cell: str, schedule: Schedule, rank: int) -> Action:
    digits = 0
    while digits < len(cell) and cell[digits].isdigit():
        digits += 1
    stage = int(cell[:digits])
    letter = cell[digits]
    if letter not in _FROM_TORCH or not cell[digits + 1:].isdigit():
        raise ValueError(f"cannot parse pipelining action {cell!r}")
    owner, chunk = schedule.locate(stage)
    if owner != rank:
        raise ValueError(f"action {cell!r} in row {rank} belongs to rank {owner}")
    return Action(rank=rank, kind=_FROM_TORCH[letter], chunk=chunk,
                  microbatch=int(cell[digits + 1:]))
