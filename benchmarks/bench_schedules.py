#!/usr/bin/env python3
"""ZB-auto against its lower bound, ZB-H1 and 1F1B over a (pp, microbatches) grid.

Costs: T_F = 1, T_B = 1, T_W = 0.6 per stage, first and last stage 1.5x slower
(embedding / LM head), no transfer latency. Memory limits: 2p (= zb-auto's default)
and p (1F1B's budget). For every point the table shows makespans, the documented lower
bound (``odc_pp.schedule.search.makespan_lower_bound``), makespan-normalised bubbles
(``(makespan - busiest rank's work) / makespan``) of the schedule and of the bound, the
gap between them, the zero-bubble paper's span-based bubble of zb-auto, and the search
time. Target: gap <= 2% wherever m >= 2p and limit >= 2p; zb-auto never slower than
ZB-H1 / 1F1B.

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
from odc_pp.schedule.compare import build_schedule  # noqa: E402
from odc_pp.schedule.search import makespan_lower_bound, zb_auto  # noqa: E402
from odc_pp.schedule.simulator import simulate  # noqa: E402

TARGET_GAP = 0.02


def bench_costs(pp: int) -> CostModel:
    slow = [1.5 if r in (0, pp - 1) else 1.0 for r in range(pp)]
    return CostModel(t_f=slow, t_b=slow, t_w=[0.6 * s for s in slow])


def _baseline(name: str, pp: int, m: int, costs: CostModel, limit: float) -> float | None:
    try:
        schedule = build_schedule(name, pp=pp, num_microbatches=m, costs=costs,
                                  memory_limit=limit)
    except ValueError:
        return None
    sim = simulate(schedule, costs, memory_limit=limit)
    return sim.makespan if sim.fits_memory else None


def run_point(pp: int, m: int, limit_name: str) -> dict:
    costs = bench_costs(pp)
    limit = 2.0 * pp if limit_name == "2p" else float(pp)
    began = time.perf_counter()
    schedule = zb_auto(pp=pp, num_microbatches=m, costs=costs, memory_limit=limit)
    seconds = time.perf_counter() - began
    sim = simulate(schedule, costs, memory_limit=limit)
    bound = makespan_lower_bound(pp, m, costs, memory_limit=limit)
    busiest = max(sim.busy)
    bubble = (sim.makespan - busiest) / sim.makespan
    bound_bubble = (bound - busiest) / bound
    zb_h1 = _baseline("zb-h1", pp, m, costs, limit)
    one_f_one_b = _baseline("1f1b", pp, m, costs, limit)
    never_worse = all(base is None or sim.makespan <= base + 1e-9
                      for base in (zb_h1, one_f_one_b))
    in_target_regime = m >= 2 * pp and limit >= 2 * pp
    return {
        "pp": pp, "microbatches": m, "memory_limit": limit, "limit": limit_name,
        "zb_auto_makespan": round(sim.makespan, 6), "lower_bound": round(bound, 6),
        "zb_auto_bubble": round(bubble, 6), "bound_bubble": round(bound_bubble, 6),
        "gap": round(bubble - bound_bubble, 6) + 0.0,
        "zb_auto_paper_bubble": round(sim.bubble_rate, 6),
        "zb_auto_peak_activation": max(sim.peak_activation),
        "fits_memory": sim.fits_memory,
        "zb_h1_makespan": zb_h1, "one_f_one_b_makespan": one_f_one_b,
        "never_worse": never_worse, "search_seconds": round(seconds, 3),
        "source": schedule.meta.get("source"),
        "target_regime": in_target_regime,
        "target_met": (bubble - bound_bubble <= TARGET_GAP) if in_target_regime else None,
    }


def _table(rows: list[dict]) -> str:
    head = (f"{'pp':>3} {'m':>4} {'limit':>5} {'zb-auto':>9} {'bound':>9} {'bubble':>7} "
            f"{'bnd bub':>7} {'gap':>6} {'paper':>6} {'zb-h1':>9} {'1f1b':>9} "
            f"{'secs':>6} {'ok':>3}")
    lines = [head, "-" * len(head)]
    for r in rows:
        def num(v):
            return f"{v:>9.2f}" if v is not None else f"{'-':>9}"
        ok = {True: "yes", False: "NO", None: "-"}[r["target_met"]]
        if not r["never_worse"]:
            ok = "BAD"
        lines.append(f"{r['pp']:>3} {r['microbatches']:>4} {r['limit']:>5} "
                     f"{r['zb_auto_makespan']:>9.2f} {r['lower_bound']:>9.2f} "
                     f"{r['zb_auto_bubble']:>7.2%} {r['bound_bubble']:>7.2%} "
                     f"{r['gap']:>6.2%} {r['zb_auto_paper_bubble']:>6.1%} "
                     f"{num(r['zb_h1_makespan'])} {num(r['one_f_one_b_makespan'])} "
                     f"{r['search_seconds']:>6.2f} {ok:>3}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="pp in {4, 8}, m in {p, 2p, 4p}")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
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
        "total_seconds": round(time.perf_counter() - began, 2),
    }
    doc = {"benchmark": "schedules", "costs": "T_F=1, T_B=1, T_W=0.6; first/last stage 1.5x",
           "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                       "platform": platform.platform()},
           "rows": rows, "summary": summary}
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print(_table(rows))
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
