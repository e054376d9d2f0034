"""Schedule generators: ``generate(name, pp=, num_microbatches=, ...) -> Schedule``.

Every generator returns a compute-only schedule (F, B, W, BW) for the whole pipeline,
as a pure function of its arguments. Memory limits are in the cost model's activation
delta units: one microbatch through one chunk adds ``mem_f`` (default +1), B adds
``mem_b`` (0), W ``mem_w`` (-1). For V placements a chunk holds half of a rank's layers,
so 1F1B's peak of ``pp`` microbatches equals ``2 pp`` V-chunk units.
"""

from __future__ import annotations

import dataclasses

from ..costs import CostModel
from ..ir import Schedule
from ..placement import Placement
from ..validate import peak_memory
from .families import FAMILIES, FAMILY_NAMES, Family, family
from .gaps import fill_gaps

__all__ = ["FAMILY_NAMES", "FAMILIES", "Family", "family", "generate", "generate_family",
           "default_chunks"]

def default_chunks(name: str) -> int:
    """Model chunks per rank a family uses when ``num_chunks`` is not given."""
    return family(name).default_chunks


def _check_shape(fam: Family, pp: int, num_microbatches: int, num_chunks: int) -> None:
    if not isinstance(pp, int) or pp < 1:
        raise ValueError(f"pp must be an integer >= 1, got {pp!r}")
    if not isinstance(num_microbatches, int) or num_microbatches < 1:
        raise ValueError(f"num_microbatches must be an integer >= 1, got {num_microbatches!r}")
    if not isinstance(num_chunks, int) or num_chunks < 1:
        raise ValueError(f"num_chunks must be an integer >= 1, got {num_chunks!r}")
    name = fam.name
    if not fam.accepts_chunks(num_chunks):
        if fam.max_chunks == 1:
            raise ValueError(f"{name} runs one model chunk per rank, got num_chunks="
                             f"{num_chunks}; use 'interleaved' for several chunks or a V "
                             f"schedule (zbv, v-half, v-min) for two")
        if fam.placement is Placement.V:
            raise ValueError(f"{name} uses the V placement with exactly 2 chunks per rank "
                             f"(each holds half of the rank's layers, so the layer count "
                             f"must split into 2 * pp chunks), got num_chunks={num_chunks}")
        raise ValueError(f"{name} needs num_chunks >= {fam.min_chunks} (got {num_chunks}); "
                         f"use 1f1b for one chunk")
    needed = fam.microbatches_per_rank * pp
    if num_microbatches < needed:
        times = "pp" if fam.microbatches_per_rank == 1 else f"{fam.microbatches_per_rank} * pp"
        raise ValueError(f"{name} needs num_microbatches >= {times} ({needed}), got "
                         f"{num_microbatches}; raise the microbatch count")


def _check_costs(costs: CostModel) -> None:
    if costs.mem_f <= 0 or costs.mem_b > 1e-12 or costs.mem_w > 1e-12:
        raise ValueError("generators need forward to allocate and backward to free "
                         f"(mem_f > 0, mem_b <= 0, mem_w <= 0); got mem_f={costs.mem_f}, "
                         f"mem_b={costs.mem_b}, mem_w={costs.mem_w}")


def _check_options(fam: Family, options: dict) -> None:
    unknown = set(options) - fam.options
    if unknown:
        allowed = ", ".join(sorted(fam.options)) or "none"
        raise ValueError(f"{fam.name} does not take option(s) {', '.join(sorted(unknown))}; "
                         f"allowed: {allowed}")
    group_size = options.get("group_size")
    if group_size is not None and (not isinstance(group_size, int) or group_size < 1):
        raise ValueError(f"group_size must be an integer >= 1, got {group_size!r}")


def _check_fixed_memory(schedule: Schedule, costs: CostModel,
                        memory_limit: float | None) -> None:
    peak = max(peak_memory(schedule, costs))
    if memory_limit is not None and peak > memory_limit + 1e-9:
        controlled = ", ".join(f.name for f in FAMILIES if f.memory_controlled)
        raise ValueError(f"{schedule.name} needs {peak:g} activation units per rank, above "
                         f"memory_limit {memory_limit:g}; raise memory_limit or pick a "
                         f"memory-controlled schedule ({controlled})")
    schedule.meta["memory_limit"] = memory_limit if memory_limit is not None else peak


def generate(name: str, *, pp: int, num_microbatches: int, num_chunks: int | None = None,
             costs: CostModel | None = None, memory_limit: float | None = None,
             **options) -> Schedule:
    """Build schedule family ``name`` (one of FAMILY_NAMES) for the given shape.

    ``memory_limit`` caps each rank's activation memory (units in the module doc);
    families with a fixed pattern (``memory_controlled`` False in the registry) reject a
    limit below their peak, memory-controlled ones build within ``min(nominal, limit)``.
    Options: ``group_size`` for interleaved/gis/offload; zb-auto forwards ``objective`` and
    ``max_evaluations`` to ``odc_pp.schedule.generators.search.zb_auto``; every family but
    the offloading one takes ``fill_gaps`` (candidate moves, 0: off): the family's schedule
    is then passed through ``gaps.fill_gaps`` under ``costs``, within the family's memory
    cap (a fixed pattern: its own peak, so the fill never adds memory; see ``_filled``).
    Turning a
    name into the schedule a program runs (lowered) is ``odc_pp.schedule.build.build``.
    """
    return generate_family(family(name), pp=pp, num_microbatches=num_microbatches,
                           num_chunks=num_chunks, costs=costs, memory_limit=memory_limit,
                           **options)


def generate_family(fam: Family, *, pp: int, num_microbatches: int,
                    num_chunks: int | None = None, costs: CostModel | None = None,
                    memory_limit: float | None = None, **options) -> Schedule:
    """:func:`generate` for a family row resolved already."""
    name = fam.name
    num_chunks = fam.default_chunks if num_chunks is None else num_chunks
    _check_shape(fam, pp, num_microbatches, num_chunks)
    fill = options.pop("fill_gaps", 0) or 0
    if fill and fam.offloads:
        raise ValueError(f"{name} does not take fill_gaps: its OFFLOAD/RELOAD timing is "
                         "planned with the order it builds")
    _check_options(fam, options)
    costs = CostModel() if costs is None else costs
    if not isinstance(costs, CostModel):
        raise ValueError(f"costs must be a CostModel, got {type(costs).__name__}")
    _check_costs(costs)
    if memory_limit is not None:
        minimum = num_chunks * costs.mem_f if fam.placement is Placement.V else costs.mem_f
        if memory_limit < minimum - 1e-9:
            raise ValueError(f"memory_limit (--memory-limit) {memory_limit:g} is below "
                             f"{minimum:g}, the minimum of {name}: the activations one "
                             f"microbatch needs on a rank ({num_chunks} chunk(s) x mem_f "
                             f"{costs.mem_f:g}); raise memory_limit to at least {minimum:g}")
    limit = memory_limit
    if fam.cap_units is not None:
        limit = fam.nominal_cap(pp, costs, memory_limit)
    schedule = fam.builder(pp, num_microbatches, num_chunks, costs, limit, options)
    if not fam.memory_controlled:
        _check_fixed_memory(schedule, costs, memory_limit)
    if fill:
        schedule = _filled(fam, schedule, (pp, num_microbatches, num_chunks), costs, limit,
                           options, fill)
    return schedule


def _filled(fam: Family, schedule: Schedule, shape: tuple, costs: CostModel,
            limit: float | None, options: dict, budget: int) -> Schedule:
    """``schedule`` with its gaps filled under ``costs`` (``gaps.fill_gaps``), or, when
    that is shorter, the family's plan for uniform times (same memory deltas) filled: a
    cost-aware generator serves its own objective (the V families: the worst bubble),
    which need not be the step time. A searched family (zb-auto) keeps its own plan. Each
    is filled within the family's cap, a fixed pattern within its own peak."""
    candidates = [schedule]
    if not fam.searched:
        uniform = dataclasses.replace(costs, t_f=1.0, t_b=1.0, t_w=1.0)
        other = fam.builder(*shape, uniform, limit, options)
        if other.ranks != schedule.ranks:
            candidates.append(other)
    filled = []
    for candidate in candidates:
        own_peak = max(peak_memory(candidate, costs))
        cap = limit if fam.memory_controlled and limit is not None else own_peak
        filled.append(fill_gaps(candidate, costs, memory_limit=max(cap, own_peak),
                                max_evaluations=budget))
    return min(filled, key=lambda s: s.meta["gap_fill"]["makespan"])
