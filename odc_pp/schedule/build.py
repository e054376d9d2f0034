"""The one place a schedule name becomes a schedule: ``build(ScheduleRequest, costs)``.

A :class:`ScheduleRequest` is made once from the schedule settings (training flags, the
``odc-pp schedule`` command line, a planner candidate): the family name is resolved to
its :class:`~odc_pp.schedule.generators.Family` row there and never again. ``build``
generates the compute schedule and always ends in :func:`~odc_pp.schedule.lowering.lower`,
the one chain of lowering passes (offload, communication, post-validation).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .costs import CostModel
from .generators import Family, family, generate_family
from .ir import Schedule
from .lowering import forward_only, lower

__all__ = ["ScheduleRequest", "build", "ALL_CHUNKS", "PLANNED_CHUNKS"]

ALL_CHUNKS = "all"
"""``ScheduleRequest.offload``: every local chunk of an offloading family."""
PLANNED_CHUNKS = "planned"
"""``ScheduleRequest.offload``: the chunks the family itself chose
(``meta["offload_chunks"]``)."""


@dataclass(frozen=True, kw_only=True)
class ScheduleRequest:
    """Everything that decides a schedule except the cost model (hashable: a cache key)."""

    family: Family
    """The schedule family's registry row (resolved once, by :meth:`of`)."""
    pp: int
    """Pipeline ranks."""
    num_microbatches: int
    """Microbatches of one replica's minibatch."""
    num_chunks: int
    """Model chunks per rank (the family's default when :meth:`of` gets None)."""
    memory_limit: float | None = None
    """Cap on each rank's activation memory in the cost model's units (None: none)."""
    options: tuple[tuple[str, object], ...] = ()
    """Generator options as sorted (name, value) pairs (zb-auto: ``objective``,
    ``max_evaluations``; interleaved, gis, offload: ``group_size``; any family but
    offload: ``fill_gaps``)."""
    offload: tuple[int, ...] | str = ALL_CHUNKS
    """Chunks whose saved activations go to host memory, for an offloading family:
    ``ALL_CHUNKS``, ``PLANNED_CHUNKS`` or a tuple of chunks (empty: no offload passes).
    A non-empty tuple with any other family is a ValueError."""
    assumed_offload_bandwidth: float | None = 1.0
    """Host-link bandwidth an offloading family plans with when the cost model has none
    (one microbatch-chunk of activations per forward time unit); None: none assumed, so
    such a family rejects costs without one."""
    communication: bool = True
    """Lower the explicit SEND/RECV actions between ranks (the runtime needs them)."""
    post_validation: bool = False
    """Mark each rank's POST_VALIDATION point (--enable-optimizer-post-validation)."""
    forward_only: bool = False
    """Keep only the forwards, in training order (evaluation); no offload, no
    post-validation."""
    selective_offload: bool = False
    """Offload only the (chunk, microbatch) passes whose activations live long enough to
    hide the transfers (PipeOffload's selective offload, ``lowering.insert_offload``)."""

    def __post_init__(self) -> None:
        if isinstance(self.offload, str) and self.offload not in (ALL_CHUNKS, PLANNED_CHUNKS):
            raise ValueError(f"offload must be {ALL_CHUNKS!r}, {PLANNED_CHUNKS!r} or a tuple "
                             f"of chunks, got {self.offload!r}")
        if isinstance(self.offload, tuple) and self.offload and not self.family.offloads:
            from .generators import FAMILIES
            raise ValueError(f"offload_chunks {list(self.offload)} need an offloading "
                             f"schedule ({', '.join(f.name for f in FAMILIES if f.offloads)}),"
                             f" not {self.family.name}")

    @classmethod
    def of(cls, name: str, *, pp: int, num_microbatches: int, num_chunks: int | None = None,
           offload_chunks=None, search: dict | None = None, fill_gaps: int = 0,
           group_size: int | None = None, **fields) -> ScheduleRequest:
        """The request for family ``name`` (ValueError for an unknown one).
        ``offload_chunks``: a list of chunks, or None / empty for every local chunk;
        ``search``: ``objective`` / ``max_evaluations`` for a searched family (zb-auto),
        ignored by the others (None values are dropped); ``fill_gaps``: candidate moves of
        the gap-filling pass (``generators.gaps``; 0: none); ``group_size``: microbatches
        per model chunk at a time (families with the ``group_size`` option; None: the
        family's default)."""
        fam = family(name)
        if offload_chunks and "offload" in fields:
            raise ValueError("give offload_chunks or offload, not both")
        if offload_chunks:
            fields["offload"] = tuple(offload_chunks)
        kept = tuple(sorted((k, v) for k, v in (search or {}).items() if v is not None)) \
            if fam.searched else ()
        if fill_gaps:
            kept = tuple(sorted(kept + (("fill_gaps", int(fill_gaps)),)))
        if group_size is not None:
            if "group_size" not in fam.options:
                raise ValueError(f"a microbatch group size ({group_size}) needs a grouped "
                                 f"schedule (interleaved, gis, offload), not {name}")
            kept = tuple(sorted(kept + (("group_size", int(group_size)),)))
        return cls(family=fam, pp=pp, num_microbatches=num_microbatches,
                   num_chunks=fam.default_chunks if num_chunks is None else num_chunks,
                   options=kept, **fields)

    @property
    def name(self) -> str:
        """The family's name."""
        return self.family.name

    def with_microbatches(self, num_microbatches: int) -> ScheduleRequest:
        """The same request for another microbatch count."""
        return dataclasses.replace(self, num_microbatches=num_microbatches)

    def evaluation(self) -> ScheduleRequest:
        """The forward-only variant (evaluation): no gap filling either (it only moves
        W's, which a forward-only schedule drops)."""
        options = tuple((k, v) for k, v in self.options if k != "fill_gaps")
        return dataclasses.replace(self, forward_only=True, post_validation=False,
                                   options=options)


def _offload_chunks(request: ScheduleRequest, schedule: Schedule) -> list[int] | bool | None:
    """``lower``'s ``offload`` argument for ``request``."""
    if not request.family.offloads or request.forward_only or request.offload == ():
        return False
    if request.offload == ALL_CHUNKS:
        return list(range(schedule.num_chunks))
    if request.offload == PLANNED_CHUNKS:
        return None
    return list(request.offload)


def build(request: ScheduleRequest, costs: CostModel | None = None) -> Schedule:
    """The schedule ``request`` describes under ``costs`` (None: uniform costs): the
    family's compute schedule, then :func:`~odc_pp.schedule.lowering.lower`.
    Raises ValueError for settings the family rejects."""
    costs = CostModel() if costs is None else costs
    if request.family.offloads and costs.offload_bandwidth is None and \
            request.assumed_offload_bandwidth is not None:
        costs = CostModel.from_dict(dict(costs.to_dict(),
                                         offload_bandwidth=request.assumed_offload_bandwidth))
    schedule = generate_family(request.family, pp=request.pp,
                               num_microbatches=request.num_microbatches,
                               num_chunks=request.num_chunks, costs=costs,
                               memory_limit=request.memory_limit, **dict(request.options))
    if request.forward_only:
        schedule = forward_only(schedule)
    return lower(schedule, costs, communication=request.communication,
                 offload=_offload_chunks(request, schedule),
                 selective_offload=request.selective_offload,
                 post_validation=request.post_validation and not request.forward_only)
