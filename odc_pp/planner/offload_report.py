"""``odc-pp tune-offload``'s printed report: the hardware in words, the ranked table with
its legend, candidates whose predictions coincide printed as one row."""

from __future__ import annotations

from .hardware import Hardware

__all__ = ["describe_hardware", "format_ranking", "RANKING_LEGEND"]

RANKING_LEGEND = (
    "tp: tensor-parallel ranks per stage; sp: sequence parallel (--sequence-parallel, "
    "always with tp > 1); W in: the weight gradient's sequence-parallel inputs, gathered "
    "again in W or kept from B (--keep-sp-input-for-w); pp: pipeline ranks",
    "offload: local model chunks whose activations wait in host memory (--offload-chunks); "
    "recompute lgd: --recompute-lgd (layernorm, GeLU, dropout recomputed in B)",
    "step: predicted iteration time; peak: the largest rank's predicted memory; bubble: "
    "idle share of the busiest rank's pipeline span; fits: peak within the budget",
    "schedules with the same prediction share a row")


def describe_hardware(hardware: Hardware) -> str:
    """``H100-SXM5-80GB: 989 TFLOP/s peak at MFU 0.45, 80 GB, host link 50 GB/s, ...``."""
    parts = [f"{hardware.peak_tflops:g} TFLOP/s peak at MFU {hardware.mfu:g}",
             f"{hardware.memory_gb:g} GB", f"host link {hardware.host_link_gbps:.3g} GB/s"]
    if hardware.tp_link_gbps is not None:
        parts.append(f"NVLink {hardware.tp_link_gbps:g} GB/s")
    parts.append(f"{hardware.gpus_per_node} GPUs per node")
    if hardware.internode_gbps is not None:
        parts.append(f"{hardware.internode_gbps:g} GB/s between nodes")
    if hardware.memory_gbps is not None:
        parts.append(f"HBM {hardware.memory_gbps:g} GB/s")
    return f"{hardware.name}: " + ", ".join(parts)


# rows are :class:`odc_pp.planner.offload_tuner.OffloadChoice` (not imported: it imports this)


def _key(c) -> tuple:
    """What a row prints, but the schedule."""
    return (c.tp, c.sequence_parallel, c.keep_sp_input_for_w, c.pp, c.offload_chunks,
            c.recompute, round(c.step_s * 1e3, 2), round(c.peak_memory_gb, 2),
            round(c.bubble_rate * 100, 1), c.fits)


def _merged(candidates: list) -> list[tuple[object, list[str]]]:
    """Rows in ranking order, each with the schedules of every candidate it stands for."""
    rows: dict[tuple, tuple[object, list[str]]] = {}
    for c in candidates:
        rows.setdefault(_key(c), (c, []))[1].append(c.schedule)
    return list(rows.values())


def format_ranking(candidates: list, *, budget_gb: float, top: int = 15) -> str:
    """The ranked table of :func:`~odc_pp.planner.offload_tuner.tune`'s candidates
    (``top`` rows) and its legend."""
    rows = _merged(candidates)
    names = [", ".join(schedules) for _, schedules in rows[:top]]
    width = max([len("schedule")] + [len(n) for n in names])
    header = (f"{'#':>3} {'tp':>3} {'sp':>3} {'W in':>6} {'pp':>3} {'schedule':<{width}} "
              f"{'offload':<7} {'recompute':<9} {'step (ms)':>10} {'peak (GB)':>10} "
              f"{'bubble':>7} fits")
    lines = [f"memory budget per rank: {budget_gb:.1f} GB", header, "-" * len(header)]
    for rank, ((c, _), name) in enumerate(zip(rows, names), 1):
        chunks = ",".join(map(str, c.offload_chunks)) or "-"
        w_in = ("kept" if c.keep_sp_input_for_w else "gather") if c.sequence_parallel else "-"
        lines.append(f"{rank:>3} {c.tp:>3} {'yes' if c.sequence_parallel else '-':>3} "
                     f"{w_in:>6} {c.pp:>3} {name:<{width}} {chunks:<7} "
                     f"{'lgd' if c.recompute else 'no':<9} {c.step_s * 1e3:>10.2f} "
                     f"{c.peak_memory_gb:>10.2f} {c.bubble_rate:>7.1%} "
                     f"{'yes' if c.fits else 'NO'}")
    if len(rows) > top:
        lines.append(f"({len(rows) - top} more rows: --top)")
    return "\n".join(lines + list(RANKING_LEGEND))
