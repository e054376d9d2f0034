"""Side-by-side comparison of schedule families for one pipeline setting."""

from __future__ import annotations

import time

from .costs import CostModel
from .build import PLANNED_CHUNKS, ScheduleRequest, build
from .generators import FAMILY_NAMES
from .simulator import simulate

__all__ = ["compare_schedules", "format_table", "family_names",
           "per_chunk_costs"]



def family_names() -> list[str]:
    """Every schedule family, in registry order."""
    return list(FAMILY_NAMES)


def per_chunk_costs(costs: CostModel, num_chunks: int) -> CostModel:
    """Per-rank compute times split evenly over ``num_chunks`` chunks of the rank."""
    if num_chunks == 1:
        return costs

    def split(value):
        if isinstance(value, (int, float)):
            return value / num_chunks
        return [v / num_chunks for v in value]
    data = costs.to_dict()
    for name in ("t_f", "t_b", "t_w"):
        data[name] = split(data[name])
    return CostModel.from_dict(data)


def compare_schedules(pp: int, num_microbatches: int, costs: CostModel | None = None,
                      memory_limit: float | None = None,
                      names: list[str] | None = None, *, objective: str = "span",
                      max_evaluations: int | None = None) -> list[dict]:
    """One row per family: name, chunks, makespan, makespan_bubble_rate (the busiest
    rank's idle share of the makespan), max_stage_span, bubble_rate (of that span: the
    zero-bubble paper's), peak_activation (per rank), search_seconds (generation time, or the search's own record), fits_memory.
    A family that rejects the setting gets a row with ``error`` (its reason) instead.

    ``costs`` holds per-rank compute times (all of a rank's layers): a family with V
    chunks per rank runs each chunk in ``1/V`` of them, so rows compare the same model.
    Memory stays in microbatch-chunk units (the generators' convention). Families that
    plan offloading (``meta["offload_chunks"]``) are simulated with their OFFLOAD/RELOAD
    actions inserted.
    """
    costs = CostModel() if costs is None else costs
    rows = []
    for name in (family_names() if names is None else names):
        began = time.perf_counter()
        try:
            request = ScheduleRequest.of(
                name, pp=pp, num_microbatches=num_microbatches, memory_limit=memory_limit,
                search={"objective": objective, "max_evaluations": max_evaluations},
                offload=PLANNED_CHUNKS, assumed_offload_bandwidth=None, communication=False)
            chunk_costs = per_chunk_costs(costs, request.num_chunks)
            schedule = build(request, chunk_costs)
            seconds = time.perf_counter() - began
            sim = simulate(schedule, chunk_costs, memory_limit=memory_limit)
        except ValueError as exc:
            rows.append({"name": name, "error": str(exc).splitlines()[0]})
            continue
        rows.append({
            "name": name, "chunks": schedule.num_chunks,
            "placement": schedule.placement.value, "makespan": sim.makespan,
            "makespan_bubble_rate": sim.makespan_bubble_rate,
            "max_stage_span": sim.max_stage_span,
            "bubble_rate": sim.bubble_rate, "peak_activation": sim.peak_activation,
            "peak_rank_microbatches": max(sim.peak_activation) / schedule.num_chunks,
            "fits_memory": sim.fits_memory,
            "search_seconds": float(schedule.meta.get("search_seconds", seconds)),
        })
    return rows


def format_table(rows: list[dict]) -> str:
    """Fixed-width text table with a legend; rows with ``error`` show the reason."""
    header = (f"{'schedule':<12} {'chunks':>6} {'makespan':>9} {'bubble':>7} {'span':>9} "
              f"{'span bub':>8} {'peak mem':>9} {'peak/rank':>9} {'fits':>5} {'seconds':>8}")
    lines = [header, "-" * len(header)]
    for row in rows:
        if "error" in row:
            lines.append(f"{row['name']:<12} rejected: {row['error']}")
            continue
        lines.append(f"{row['name']:<12} {row['chunks']:>6} {row['makespan']:>9.3f} "
                     f"{row['makespan_bubble_rate']:>7.2%} {row['max_stage_span']:>9.3f} "
                     f"{row['bubble_rate']:>8.2%} {max(row['peak_activation']):>9.3g} "
                     f"{row['peak_rank_microbatches']:>9.3g} "
                     f"{'yes' if row['fits_memory'] else 'NO':>5} "
                     f"{row['search_seconds']:>8.3f}")
    lines += ["makespan: first start to last end; bubble: the busiest rank's idle share of "
              "the makespan (1 - busy / makespan)",
              "span: the longest per-rank compute span (the iteration time when iterations "
              "overlap, --objective span); span bub: idle share of it (the zero-bubble "
              "paper's bubble rate)",
              "peak mem: microbatch-chunk activations; peak/rank: the same in microbatches "
              "through all of a rank's layers (1F1B's peak is pp)"]
    return "\n".join(lines)
