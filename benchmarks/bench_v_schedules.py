#!/usr/bin/env python3
"""Controllable-memory V schedules (arXiv 2405.15362) against 1F1B at equal costs.

For pp in {4, 8, 16} and m in {2 pp, 4 pp}: the simulator's bubble rate (the papers'
``1 - m (F + B + W) / longest per-rank span``) and peak activation memory of 1F1B, V-Min,
V-Half and ZB-V. Costs: F = B = W = 1 per V chunk (a V chunk holds half a rank's layers)
and 2 per 1F1B stage, no transfer latency; bubble rates do not depend on the time unit.
Memory budgets are the paper's, in microbatches through all of a rank's layers: V-Min
(pp + 4) // 3, V-Half (pp + 2) // 2, ZB-V pp (two V-chunk units each, passed as
``memory_limit``); 1F1B uses pp. Peaks are reported in the same microbatch unit. The
paper's approximate bubbles are p/m (1F1B), 2p/3m (V-Min), p/2m (V-Half), 0 (ZB-V); the
ratio columns divide our bubble rate by p/2m and by 2p/3m.

Rows for two memory models: ``w-frees`` (this project's default deltas F +1, B 0, W -1)
and ``b-frees`` (F +1, B -1, W 0). Target: V-Min and V-Half below 1F1B in every row.

    python benchmarks/bench_v_schedules.py [--json] [--output PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from odc_pp.schedule import CostModel  # noqa: E402
from odc_pp.schedule.generators import generate  # noqa: E402
from odc_pp.schedule.simulator import simulate  # noqa: E402

MODELS = {"w-frees": dict(mem_f=1.0, mem_b=0.0, mem_w=-1.0),
          "b-frees": dict(mem_f=1.0, mem_b=-1.0, mem_w=0.0)}
DEFAULT_OUTPUT = os.path.join(ROOT, "benchmarks", "results", "v_schedules.json")


def budget_microbatches(name: str, pp: int) -> int:
    """The paper's activation budget of a family, in whole-rank microbatches."""
    return {"1f1b": pp, "zbv": pp, "v-half": (pp + 2) // 2, "v-min": (pp + 4) // 3}[name]


def run_point(pp: int, m: int, model: str) -> dict:
    deltas = MODELS[model]
    row: dict = {"pp": pp, "microbatches": m, "memory_model": model,
                 "p_over_2m": pp / (2 * m), "two_p_over_3m": 2 * pp / (3 * m)}
    for name in ("1f1b", "v-min", "v-half", "zbv"):
        chunks = 1 if name == "1f1b" else 2
        costs = CostModel(t_f=2.0 / chunks, t_b=2.0 / chunks, t_w=2.0 / chunks, **deltas)
        limit = budget_microbatches(name, pp) * chunks * costs.mem_f
        began = time.perf_counter()
        schedule = generate(name, pp=pp, num_microbatches=m, costs=costs,
                            memory_limit=None if name == "1f1b" else limit)
        seconds = time.perf_counter() - began
        sim = simulate(schedule, costs, memory_limit=limit)
        row[name] = {
            "bubble_rate": sim.bubble_rate, "makespan": sim.makespan,
            "budget_microbatches": budget_microbatches(name, pp),
            "peak_microbatches": max(sim.peak_activation) / chunks,
            "fits_budget": sim.fits_memory, "generate_seconds": round(seconds, 3),
            "ratio_to_p_over_2m": sim.bubble_rate / row["p_over_2m"],
            "ratio_to_2p_over_3m": sim.bubble_rate / row["two_p_over_3m"],
        }
    base = row["1f1b"]["bubble_rate"]
    row["v_min_below_1f1b"] = row["v-min"]["bubble_rate"] < base
    row["v_half_below_1f1b"] = row["v-half"]["bubble_rate"] < base
    return row


def _table(rows: list[dict]) -> str:
    head = (f"{'model':<8} {'pp':>3} {'m':>4} | {'1F1B':>6} {'V-Min':>6} {'V-Half':>6} "
            f"{'ZB-V':>6} | peak mb (budget) V-Min V-Half ZB-V | V-Min/(2p/3m) "
            f"V-Half/(p/2m)")
    lines = [head, "-" * len(head)]
    for r in rows:
        peaks = " ".join(f"{r[n]['peak_microbatches']:g}({r[n]['budget_microbatches']})"
                         for n in ("v-min", "v-half", "zbv"))
        lines.append(
            f"{r['memory_model']:<8} {r['pp']:>3} {r['microbatches']:>4} | "
            f"{r['1f1b']['bubble_rate']:>6.3f} {r['v-min']['bubble_rate']:>6.3f} "
            f"{r['v-half']['bubble_rate']:>6.3f} {r['zbv']['bubble_rate']:>6.3f} | "
            f"{peaks:<33} | {r['v-min']['ratio_to_2p_over_3m']:>13.2f} "
            f"{r['v-half']['ratio_to_p_over_2m']:>13.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true",
                        help="print one JSON document and write it to --output")
    parser.add_argument("--output", default=DEFAULT_OUTPUT,
                        help="file for the --json document (default "
                             "benchmarks/results/v_schedules.json)")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    rows = [run_point(pp, factor * pp, model) for model in MODELS for pp in (4, 8, 16)
            for factor in (2, 4)]
    summary = {
        "rows": len(rows),
        "v_min_below_1f1b": sum(r["v_min_below_1f1b"] for r in rows),
        "v_half_below_1f1b": sum(r["v_half_below_1f1b"] for r in rows),
        "all_within_budget": all(r[n]["fits_budget"] for r in rows
                                 for n in ("v-min", "v-half", "zbv")),
        "total_seconds": round(time.perf_counter() - began, 2),
    }
    doc = {"benchmark": "v_schedules",
           "costs": "F=B=W=1 per V chunk (2 per 1F1B stage), t_comm=0",
           "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                       "platform": platform.platform()},
           "rows": rows, "summary": summary}
    if args.json:
        text = json.dumps(doc, indent=1)
        print(text)
        os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
        with open(args.output, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")
    else:
        print(_table(rows))
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
