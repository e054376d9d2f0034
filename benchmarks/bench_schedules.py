#!/usr/bin/env python3
"""ZB-auto against its lower bound, ZB-H1, ZB-H2 and 1F1B over a (pp, microbatches) grid,
and how long every generator and the ZB-auto search take at pp=32, m=256.

Costs: T_F = 1, T_B = 1, T_W = 0.6 per stage, first and last stage 1.5x slower
(embedding / LM head), no transfer latency. Memory limits: 2p (= zb-auto's default)
and p (1F1B's budget). ZB-auto minimises the longest per-stage span (its default
objective: the iteration time when post-validation overlaps iterations); for every point
the table shows that span, the documented lower bound
(``odc_pp.schedule.generators.search.stage_span_lower_bound``), the bubble rates
(``(span - busiest rank's work) / span``, the zero-bubble paper's definition) of the
schedule and of the bound, the gap between them, the baselines' spans and the search
time. Target: gap <= 2% wherever m >= 2p and limit >= 2p; zb-auto never worse than
ZB-H1 / ZB-H2 / 1F1B where they fit.

Timing section: wall and CPU seconds of ``generate(name, pp=32, num_microbatches=256)``
for every family and of the ZB-auto search (targets: < 2 s per generator, < 10 s for
ZB-auto; on a shared machine the CPU seconds are the stable number).

    python benchmarks/bench_schedules.py [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from odc_pp.schedule import CostModel  # noqa: E402
from odc_pp.schedule.compare import compare_schedules  # noqa: E402
from odc_pp.schedule.generators import FAMILY_NAMES, generate  # noqa: E402
from odc_pp.schedule.generators.search import stage_span_lower_bound, zb_auto  # noqa: E402
from odc_pp.schedule.simulator import simulate  # noqa: E402

TARGET_GAP = 0.02
GENERATOR_TARGET_S = 2.0
SEARCH_TARGET_S = 10.0


def bench_costs(pp: int) -> CostModel:
    slow = [1.5 if r in (0, pp - 1) else 1.0 for r in range(pp)]
    return CostModel(t_f=slow, t_b=slow, t_w=[0.6 * s for s in slow])


def _baseline(name: str, pp: int, m: int, costs: CostModel, limit: float) -> float | None:
    row, = compare_schedules(pp, m, costs, limit, names=[name])
    return row["max_stage_span"] if row.get("fits_memory") else None


def run_point(pp: int, m: int, limit_name: str) -> dict:
    costs = bench_costs(pp)
    limit = 2.0 * pp if limit_name == "2p" else float(pp)
    began = time.perf_counter()
    schedule = zb_auto(pp=pp, num_microbatches=m, costs=costs, memory_limit=limit)
    seconds = time.perf_counter() - began
    sim = simulate(schedule, costs, memory_limit=limit)
    bound = stage_span_lower_bound(pp, m, costs, memory_limit=limit)
    busiest = max(sim.busy)
    bound_bubble = max(0.0, (bound - busiest) / bound)
    baselines = {name: _baseline(name, pp, m, costs, limit)
                 for name in ("zb-h1", "zb-h2", "1f1b")}
    never_worse = all(base is None or sim.max_stage_span <= base + 1e-9
                      for base in baselines.values())
    in_target_regime = m >= 2 * pp and limit >= 2 * pp
    gap = sim.bubble_rate - bound_bubble
    return {
        "pp": pp, "microbatches": m, "memory_limit": limit, "limit": limit_name,
        "zb_auto_span": round(sim.max_stage_span, 6), "lower_bound": round(bound, 6),
        "zb_auto_bubble": round(sim.bubble_rate, 6), "bound_bubble": round(bound_bubble, 6),
        "gap": round(gap, 6) + 0.0, "zb_auto_makespan": round(sim.makespan, 6),
        "zb_auto_peak_activation": max(sim.peak_activation),
        "fits_memory": sim.fits_memory,
        "zb_h1_span": baselines["zb-h1"], "zb_h2_span": baselines["zb-h2"],
        "one_f_one_b_span": baselines["1f1b"],
        "never_worse": never_worse, "search_seconds": round(seconds, 3),
        "evaluations": schedule.meta.get("evaluations"),
        "source": schedule.meta.get("source"),
        "target_regime": in_target_regime,
        "target_met": (gap <= TARGET_GAP) if in_target_regime else None,
    }


def _timed(build) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    build()
    return round(time.perf_counter() - wall, 3), round(time.process_time() - cpu, 3)


def timing(pp: int = 32, m: int = 256) -> dict:
    """Wall/CPU seconds of every generator and the ZB-auto search at (pp, m)."""
    costs = CostModel(offload_bandwidth=2.0)  # offload needs a host link
    rows = []
    for name in FAMILY_NAMES:
        wall, cpu = _timed(lambda: generate(name, pp=pp, num_microbatches=m, costs=costs))
        target = SEARCH_TARGET_S if name == "zb-auto" else GENERATOR_TARGET_S
        rows.append({"name": name, "wall_seconds": wall, "cpu_seconds": cpu,
                     "target_seconds": target, "target_met_cpu": cpu < target})
    heterogeneous = bench_costs(pp)
    wall, cpu = _timed(lambda: zb_auto(pp=pp, num_microbatches=m, costs=heterogeneous))
    search = {"costs": "bench costs (first/last stage 1.5x)", "wall_seconds": wall,
              "cpu_seconds": cpu, "target_seconds": SEARCH_TARGET_S,
              "target_met_cpu": cpu < SEARCH_TARGET_S}
    return {"pp": pp, "microbatches": m, "generators": rows, "zb_auto_search": search}


def _table(rows: list[dict]) -> str:
    head = (f"{'pp':>3} {'m':>4} {'limit':>5} {'zb-auto':>9} {'bound':>9} {'bubble':>7} "
            f"{'bnd bub':>7} {'gap':>6} {'zb-h1':>9} {'zb-h2':>9} {'1f1b':>9} "
            f"{'secs':>6} {'ok':>3}")
    lines = [head, "-" * len(head)]
    for r in rows:
        def num(v):
            return f"{v:>9.2f}" if v is not None else f"{'-':>9}"
        ok = {True: "yes", False: "NO", None: "-"}[r["target_met"]]
        if not r["never_worse"]:
            ok = "BAD"
        lines.append(f"{r['pp']:>3} {r['microbatches']:>4} {r['limit']:>5} "
                     f"{r['zb_auto_span']:>9.2f} {r['lower_bound']:>9.2f} "
                     f"{r['zb_auto_bubble']:>7.2%} {r['bound_bubble']:>7.2%} "
                     f"{r['gap']:>6.2%} {num(r['zb_h1_span'])} {num(r['zb_h2_span'])} "
                     f"{num(r['one_f_one_b_span'])} "
                     f"{r['search_seconds']:>6.2f} {ok:>3}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="pp in {4, 8}, m in {p, 2p, 4p}")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--no-timing", action="store_true",
                        help="skip the pp=32, m=256 timing section")
    args = parser.parse_args(argv)
    pps = (4, 8) if args.quick else (4, 8, 16, 32)
    factors = (1, 2, 4) if args.quick else (1, 2, 4, 8)
    began = time.perf_counter()
    rows = [run_point(pp, f * pp, limit) for limit in ("2p", "p") for pp in pps
            for f in factors]
    regime = [r for r in rows if r["target_regime"]]
    summary = {
        "points": len(rows),
        "target_regime_points": len(regime),
        "target_met_points": sum(1 for r in regime if r["target_met"]),
        "max_gap_in_target_regime": max((r["gap"] for r in regime), default=None),
        "never_worse_all": all(r["never_worse"] for r in rows),
        "max_search_seconds": max(r["search_seconds"] for r in rows),
    }
    speed = None if args.no_timing else timing()
    if speed is not None:
        summary["generators_under_2s_cpu"] = all(r["target_met_cpu"]
                                                 for r in speed["generators"]
                                                 if r["name"] != "zb-auto")
        summary["zb_auto_under_10s_cpu"] = speed["zb_auto_search"]["target_met_cpu"]
    summary["total_seconds"] = round(time.perf_counter() - began, 2)
    doc = {"benchmark": "schedules", "costs": "T_F=1, T_B=1, T_W=0.6; first/last stage 1.5x",
           "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                       "platform": platform.platform()},
           "objective": "span (longest per-stage span)", "rows": rows, "timing": speed,
           "summary": summary}
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print(_table(rows))
        if speed is not None:
            for r in speed["generators"] + [dict(speed["zb_auto_search"], name="zb-auto*")]:
                print(f"{r['name']:<12} wall {r['wall_seconds']:>7.2f} s  cpu "
                      f"{r['cpu_seconds']:>7.2f} s  (target < {r['target_seconds']:g} s)")
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
