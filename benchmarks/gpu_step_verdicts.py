"""Issue 50's targets for the one-GPU step, and each one's verdict from a
``gpu_step_<card>.json`` record's measured rows (``bench_gpu_step.py`` writes the
``verdicts`` block with :func:`verdicts`; ``tools/generate_docs.py`` turns it into the
README's row).

A verdict is ``met``, ``not met`` or ``unmeasured`` (a row it needs is missing or has no
such number), with the measured value, the target and the rows it came from. Nothing is
estimated: a number absent from the record leaves the target unmeasured.
"""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["TARGETS", "MET", "NOT_MET", "UNMEASURED", "verdicts", "summary", "main"]

MET, NOT_MET, UNMEASURED = "met", "not met", "unmeasured"
TARGETS = {
    "full_mfu": (">=", 0.60, "full rows (1F1B) MFU"),
    "full_vs_hf": (">=", 1.10, "full rows tokens/s over Hugging Face's"),
    "packed_mfu": (">=", 0.55, "lb-mini packed MFU"),
    "packed_within_points_of_full": ("<=", 0.03, "full-row MFU minus packed MFU"),
    "unpacked_vs_packed_per_token": (">=", 0.90, "unpacked tokens/s over packed"),
    "first_over_steady": ("<=", 2.0, "first iteration over the steady step (worst run)"),
    "dry_run_over_measured": ("in", (1.0, 1.1), "dry run's peak over the measured peak "
                              "(within 10%, never under; worst run)"),
    "activations_over_saved": ("<=", 1.2, "(peak allocated - model states) over the "
                               "saved activations (dry run's categories; worst run)"),
    "layer_vs_minibatch": ("<=", 1.1, "step with --odc-param-residency layer over the "
                           "default (minibatch)"),
}
"""Target name -> (comparison, bound, what is measured)."""
ODC_RUNS = ("full-1f1b", "full-zbv", "lbmini-packed", "unpacked")
"""The odc-pp runs whose first iteration and memory are judged."""
MODEL_STATES = ("params_gathered", "params_sharded", "weight_grads", "grad_accumulators",
                "optimizer_state", "odc_staging")
"""The dry run's categories that are model states (the rest: activations, transients)."""


def _judge(key: str, value: float | None, rows: list[str]) -> dict:
    op, bound, what = TARGETS[key]
    entry = {"what": what, "target": f"{op} {bound}" if op != "in" else
             f"{bound[0]} to {bound[1]}", "rows": rows}
    if value is None:
        return {**entry, "status": UNMEASURED, "value": None}
    if op == ">=":
        met = value >= bound
    elif op == "<=":
        met = value <= bound
    else:
        met = bound[0] <= value <= bound[1]
    return {**entry, "status": MET if met else NOT_MET, "value": value}


def _measured(row: dict | None, key: str) -> float | None:
    if not row or row.get("exit", 0) != 0:
        return None
    value = row.get(key)
    return float(value) if isinstance(value, (int, float)) else None


def _worst(pairs: list[tuple[str, float]], key) -> tuple[float | None, list[str]]:
    """The value furthest from its target over the rows measuring it."""
    if not pairs:
        return None, []
    name, value = max(pairs, key=lambda pair: key(pair[1]))
    return value, [name]


def _memory(rows: dict) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    dry, saved = [], []
    for name in ODC_RUNS:
        row = rows.get(name)
        peak = _measured(row, "peak_allocated_gb")
        report = (row or {}).get("dry_run") or {}
        predicted = report.get("predicted_peak_gb")
        if not peak or not predicted:
            continue
        dry.append((name, predicted / peak))
        categories = report.get("categories_gb") or {}
        activations = categories.get("activations")
        if activations:
            states = sum(categories.get(category, 0.0) for category in MODEL_STATES)
            saved.append((name, (peak - states) / activations))
    return dry, saved


def verdicts(rows: dict) -> dict:
    """Every target of :data:`TARGETS`, judged from a record's ``runs``."""
    full, hf = rows.get("full-1f1b"), rows.get("hf")
    packed, unpacked = rows.get("lbmini-packed"), rows.get("unpacked")
    out = {"full_mfu": _judge("full_mfu", _measured(full, "mfu"), ["full-1f1b"]),
           "packed_mfu": _judge("packed_mfu", _measured(packed, "mfu"), ["lbmini-packed"])}
    pair = _measured(full, "tokens_per_s"), _measured(hf, "tokens_per_s")
    out["full_vs_hf"] = _judge("full_vs_hf", pair[0] / pair[1] if all(pair) else None,
                               ["full-1f1b", "hf"])
    pair = _measured(full, "mfu"), _measured(packed, "mfu")
    out["packed_within_points_of_full"] = _judge(
        "packed_within_points_of_full",
        pair[0] - pair[1] if None not in pair else None, ["full-1f1b", "lbmini-packed"])
    pair = _measured(unpacked, "tokens_per_s"), _measured(packed, "tokens_per_s")
    out["unpacked_vs_packed_per_token"] = _judge(
        "unpacked_vs_packed_per_token", pair[0] / pair[1] if all(pair) else None,
        ["unpacked", "lbmini-packed"])
    firsts = [(name, value) for name in ODC_RUNS
              if (value := _measured(rows.get(name), "first_over_steady")) is not None]
    out["first_over_steady"] = _judge("first_over_steady", *_worst(firsts, lambda v: v))
    dry, saved = _memory(rows)
    out["dry_run_over_measured"] = _judge(
        "dry_run_over_measured", *_worst(dry, lambda v: max(1.0 - v, v - 1.1)))
    out["activations_over_saved"] = _judge("activations_over_saved",
                                           *_worst(saved, lambda v: v))
    pair = _measured(rows.get("full-1f1b-layer"), "step_s"), _measured(full, "step_s")
    out["layer_vs_minibatch"] = _judge("layer_vs_minibatch",
                                       pair[0] / pair[1] if all(pair) else None,
                                       ["full-1f1b-layer", "full-1f1b"])
    return out


def summary(block: dict) -> str:
    """``"2/9 targets met, 5 not met, 2 unmeasured"`` for a ``verdicts`` block."""
    counts = {status: sum(1 for v in block.values() if v.get("status") == status)
              for status in (MET, NOT_MET, UNMEASURED)}
    return (f"{counts[MET]}/{len(block)} targets met, {counts[NOT_MET]} not met, "
            f"{counts[UNMEASURED]} unmeasured")


def main(argv=None) -> int:
    """Recompute a record's ``verdicts`` block from its ``runs`` (in place)."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("record", help="a benchmarks/results/gpu_step_<card>.json")
    args = parser.parse_args(argv)
    with open(args.record, encoding="utf-8") as handle:
        record = json.load(handle)
    record["targets"] = {key: list(bound) if isinstance(bound, tuple) else bound
                         for key, (_, bound, _) in TARGETS.items()}
    record["verdicts"] = verdicts(record["runs"])
    with open(args.record, "w", encoding="utf-8") as handle:
        json.dump(record, handle, indent=1)
    print(f"{args.record}: {summary(record['verdicts'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
