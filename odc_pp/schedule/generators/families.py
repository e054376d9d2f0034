"""The schedule-family registry: one row per family, used by every consumer.

``generate`` (the generators), ``odc-pp schedule`` (its ``--schedule`` choices and
``--compare`` rows), ``pretrain_gpt.py`` (``--pipeline-schedule`` choices, the default
``--num-model-chunks``, the placement of model chunks) and ``odc-pp tune-offload`` (its
candidates) all read :data:`FAMILIES`; nothing else lists schedule names. Placement
arithmetic is in :mod:`odc_pp.schedule.placement`.

Memory caps of the memory-controlled families are in the cost model's activation delta
units (one microbatch through one chunk adds ``mem_f``); 1F1B's peak is ``pp``
microbatches of a whole rank's layers, i.e. ``2 pp`` V-chunk units. The V families'
nominal caps are the controllable-memory paper's budgets (arXiv 2405.15362, counted there
in microbatches through all of a rank's layers, i.e. two V-chunk units each): ZB-V ``pp``,
V-Half ``(pp + 2) // 2``, V-Min ``(pp + 4) // 3``; any memory limit replaces them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..costs import CostModel
from ..ir import Schedule
from ..placement import Placement
from . import classic, memory, offload
from .group_interleaved import group_interleaved
from .search import zb_auto

__all__ = ["Family", "FAMILIES", "FAMILY_NAMES", "family"]

Builder = Callable[[int, int, int, CostModel, "float | None", dict], Schedule]
"""``builder(pp, num_microbatches, num_chunks, costs, memory_limit, options)``; for a
memory-controlled family with a nominal cap, ``memory_limit`` is already that cap."""


@dataclass(frozen=True, kw_only=True)
class Family:
    """One schedule family."""

    name: str
    """Name on every command line (``--schedule``, ``--pipeline-schedule``)."""
    placement: Placement
    """How (rank, chunk) maps to virtual stages."""
    default_chunks: int
    """Model chunks per rank when none are given."""
    min_chunks: int
    """Fewest model chunks per rank the family accepts."""
    max_chunks: int | None
    """Most model chunks per rank it accepts (None: no upper limit)."""
    memory_controlled: bool
    """Builds within a memory limit; a fixed pattern only checks its peak against one."""
    builder: Builder
    """Builds the compute-only schedule (see ``Builder``)."""
    cap_units: Callable[[int], int] | None = None
    """Nominal activation cap in ``mem_f`` units as a function of pp (None: the family
    takes the memory limit as given)."""
    microbatches_per_rank: int = 0
    """Needs ``num_microbatches >= microbatches_per_rank * pp``."""
    options: frozenset[str] = field(default_factory=frozenset)
    """Extra keyword options the builder takes."""
    offloads: bool = False
    """Moves saved activations to host memory (needs ``--cpu-offload`` in training)."""
    searched: bool = False
    """Found by a search (bounded by evaluations, deterministic); takes the search's
    options (``objective``, ``max_evaluations``)."""
    limit_sets_cap: bool = False
    """A memory limit replaces the nominal cap (the family builds within any feasible
    limit, above its nominal cap too) instead of only lowering it."""

    def __post_init__(self) -> None:
        if not 1 <= self.min_chunks <= self.default_chunks:
            raise ValueError(f"{self.name}: need 1 <= min_chunks <= default_chunks")
        if self.max_chunks is not None and self.max_chunks < self.default_chunks:
            raise ValueError(f"{self.name}: max_chunks below default_chunks")
        if self.cap_units is not None and not self.memory_controlled:
            raise ValueError(f"{self.name}: a nominal cap needs memory_controlled")
        if self.limit_sets_cap and self.cap_units is None:
            raise ValueError(f"{self.name}: limit_sets_cap needs a nominal cap (cap_units)")

    def accepts_chunks(self, num_chunks: int) -> bool:
        return self.min_chunks <= num_chunks and (self.max_chunks is None or
                                                  num_chunks <= self.max_chunks)

    def nominal_cap(self, pp: int, costs: CostModel, memory_limit: float | None) -> float:
        """The family's cap (never below one microbatch on every chunk of a rank), lowered
        to ``memory_limit`` if that is smaller; with ``limit_sets_cap``, ``memory_limit``
        itself when given."""
        if self.cap_units is None:
            raise ValueError(f"{self.name} has no nominal memory cap")
        cap = max(self.cap_units(pp), self.default_chunks) * costs.mem_f
        if memory_limit is None:
            return cap
        return memory_limit if self.limit_sets_cap else min(cap, memory_limit)


def _zb_auto(pp, num_microbatches, num_chunks, costs, memory_limit, options):
    return zb_auto(pp=pp, num_microbatches=num_microbatches, costs=costs,
                   memory_limit=memory_limit, **options)


def _zb_h2(pp, num_microbatches, costs, cap):
    """The paper's ZB-H2 order, its in-flight limit (2 pp - 1) lowered to the cap."""
    schedule = classic.zb_h2(pp, num_microbatches,
                             inflight=max(1, min(2 * pp - 1, int(cap / costs.mem_f + 1e-9))))
    schedule.meta["memory_limit"] = cap
    return schedule


def _v_builder(name: str) -> Builder:
    def build(pp, num_microbatches, num_chunks, costs, cap, options):
        return memory.v_family(name, pp, num_microbatches, costs, cap)
    return build


_GROUPED = frozenset({"group_size"})

FAMILIES: tuple[Family, ...] = (
    Family(name="1f1b", placement=Placement.INTERLEAVED, default_chunks=1, min_chunks=1,
           max_chunks=1, memory_controlled=False,
           builder=lambda pp, m, v, costs, limit, opts: classic.one_f_one_b(pp, m)),
    Family(name="interleaved", placement=Placement.INTERLEAVED, default_chunks=2,
           min_chunks=2, max_chunks=None, memory_controlled=False, microbatches_per_rank=1,
           options=_GROUPED,
           builder=lambda pp, m, v, costs, limit, opts: classic.interleaved(
               pp, m, v, group_size=opts.get("group_size"))),
    Family(name="gis", placement=Placement.INTERLEAVED, default_chunks=2, min_chunks=2,
           max_chunks=None, memory_controlled=False, microbatches_per_rank=1,
           options=_GROUPED,
           builder=lambda pp, m, v, costs, limit, opts: group_interleaved(
               pp, m, v, group_size=opts.get("group_size"))),
    Family(name="zb-h1", placement=Placement.INTERLEAVED, default_chunks=1, min_chunks=1,
           max_chunks=1, memory_controlled=False,
           builder=lambda pp, m, v, costs, limit, opts: classic.zb_h1(pp, m)),
    Family(name="zb-h2", placement=Placement.INTERLEAVED, default_chunks=1, min_chunks=1,
           max_chunks=1, memory_controlled=True, cap_units=lambda pp: 2 * pp,
           builder=lambda pp, m, v, costs, cap, opts: _zb_h2(pp, m, costs, cap)),
    Family(name="zb-auto", placement=Placement.INTERLEAVED, default_chunks=1, min_chunks=1,
           max_chunks=1, memory_controlled=True, searched=True, builder=_zb_auto,
           options=frozenset({"objective", "max_evaluations"})),
    Family(name="zbv", placement=Placement.V, default_chunks=2, min_chunks=2, max_chunks=2,
           memory_controlled=True, cap_units=lambda pp: 2 * pp, limit_sets_cap=True,
           builder=_v_builder("zbv")),
    Family(name="v-half", placement=Placement.V, default_chunks=2, min_chunks=2,
           max_chunks=2, memory_controlled=True, cap_units=lambda pp: 2 * ((pp + 2) // 2),
           limit_sets_cap=True, builder=_v_builder("v-half")),
    Family(name="v-min", placement=Placement.V, default_chunks=2, min_chunks=2,
           max_chunks=2, memory_controlled=True, cap_units=lambda pp: 2 * ((pp + 4) // 3),
           limit_sets_cap=True, builder=_v_builder("v-min")),
    Family(name="offload", placement=Placement.INTERLEAVED, default_chunks=2, min_chunks=1,
           max_chunks=None, memory_controlled=True, microbatches_per_rank=1,
           options=_GROUPED, offloads=True,
           builder=lambda pp, m, v, costs, limit, opts: offload.offload_schedule(
               pp, m, v, costs, limit, group_size=opts.get("group_size"))),
    Family(name="dualpipev", placement=Placement.V, default_chunks=2, min_chunks=2,
           max_chunks=2, memory_controlled=False, microbatches_per_rank=2,
           builder=lambda pp, m, v, costs, limit, opts: classic.dualpipev(pp, m)),
)

FAMILY_NAMES: tuple[str, ...] = tuple(f.name for f in FAMILIES)
_BY_NAME = {f.name: f for f in FAMILIES}


def family(name: str) -> Family:
    """The registry row of ``name``; ValueError listing the names when unknown."""
    try:
        return _BY_NAME[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown schedule {name!r}; choose one of "
                         f"{', '.join(FAMILY_NAMES)}") from None
