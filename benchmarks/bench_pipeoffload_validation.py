#!/usr/bin/env python3
"""The decision tools against PipeOffload's measurements (issue 48 item 5).

The paper's numbers are ``benchmarks/data/pipeoffload_paper.json`` (arXiv 2503.01328v2:
Table 2's models, Figure 15's MFU and activation memory, Section 5.4's PP32 vs TP8 x PP4;
each value with where it was read). Every Figure 15 cell (model, sequence length, paper
schedule) is mapped onto odc-pp's flags by the one table :data:`SCHEDULES` and
:func:`cell_candidate`: pure pipeline parallelism over the model's GPUs (tp = dp = 1),
the global batch of Table 2 in micro-batches of 1 full-length sample, ``--recompute-lgd``
(LayerNorm/GeLU/dropout recomputed, as the paper ran), the ``a100`` preset, GeLU MLP of
4h, 8 KV groups, vocabulary 32000 (what the paper does not state is marked in the data
file). 1F1B takes one layer off the first and the last stage
(``--decoder-first/last-pipeline-num-layers``), as the paper did; with several chunks
Megatron's flags cannot take a layer off one virtual stage only, so those cells use the
even split (``layout_exact`` false). A cell odc-pp cannot express raises
:class:`NotExpressible` naming what is missing, and is reported as such.

Each expressible cell is priced by the planner's own entry point
(:func:`odc_pp.planner.search.predict`, what ``odc-pp plan`` and ``odc-pp tune-offload``
rank): its MFU, its activation memory as the paper defines it (peak minus the
iteration-start model state, the maximum over pipeline ranks: the planner's per-rank peak
less :func:`~odc_pp.planner.rough_memory.static_bytes`), and whether it fits 80 GB by the
dry run's memory model (:func:`odc_pp.training.plan_memory.rank_peaks`, the verdict
``odc-pp plan`` prints). Summaries: median |activation-memory error|, the share of
out-of-memory verdicts that agree (SKIP and host-OOM cells excluded), the share of
schedule pairs within each (model, sequence) row whose MFU order agrees (a tie on either
side is a disagreement), the largest |MFU error| in points, and Section 5.4's predicted
speed-ups (TP8 x PP4 interleaved step time / PP32 offload step time).

    python benchmarks/bench_pipeoffload_validation.py --json --output FILE
    python benchmarks/bench_pipeoffload_validation.py --update benchmarks/results/planner_validation.json
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import statistics
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

DATA = os.path.join(ROOT, "benchmarks", "data", "pipeoffload_paper.json")
MEMORY_GB = 80.0
"""The paper's A100 80G: the budget of the fits / out-of-memory verdict."""
VOCAB, QUERY_GROUPS = 32000, 8
"""Not stated by the paper except the groups (see the data file's ``setup``)."""


class NotExpressible(ValueError):
    """A paper cell odc-pp cannot express yet; the message names what is missing."""


SCHEDULES = {
    "1F1B": ("1f1b", {}),
    "1F1B-I": ("interleaved", {"chunks": "v"}),
    "GIS": ("gis", {"chunks": "v", "group": "d"}),
    "GIS-H": ("gis", {"chunks": "v", "group": "ceil(d/2)"}),
    "PO-H": ("offload", {"chunks": "v", "group": "1", "offloaded": "ceil(v/2)",
                         "selective": True}),
    "PO-F": ("offload", {"chunks": "v", "group": "1", "offloaded": "v"}),
}
"""Paper schedule -> (odc-pp family, options). ``chunks``: the paper's stages per device;
``group``: microbatches per group (--microbatch-group-size-per-virtual-pipeline-stage;
GIS: d, GIS-H: ceil(d/2), the paper's Table 1 memory (v+1)/(2v) of 1F1B; PipeOffload's
uniform repeating order: 1); ``offloaded``: chunks whose activations go to the host
(PO-H about half, PO-F all); ``selective``: --selective-offload (skip the passes too
short to hide). An option the planner cannot price raises :class:`NotExpressible`."""

CHUNKS_FIELD = "chunks"
"""The Candidate field that carries a chunk count other than the family's default."""
GROUP_FIELD = "group_size"
"""The Candidate field that carries the microbatch group size."""


def _fields():
    from odc_pp.planner.config import Candidate

    return {f.name for f in dataclasses.fields(Candidate)}


def _load() -> dict:
    with open(DATA, encoding="utf-8") as handle:
        return json.load(handle)


def model_row(paper: dict, name: str) -> dict:
    """Table 2's row of ``name`` (KeyError naming the model otherwise)."""
    for row in paper["models"]:
        if row["model"] == name:
            return row
    raise KeyError(f"{DATA}: no model {name!r} in 'models'")


def plan_config(row: dict, seq: int, gpus: int | None = None):
    """The PlanConfig of one Table 2 model at sequence length ``seq`` on the a100 preset:
    every sample ``seq`` tokens (pretraining), Table 2's global batch."""
    from odc_pp.planner.hardware import PRESETS
    from odc_pp.planner.inputs import ModelSpec
    from odc_pp.planner.search import PlanConfig

    model = ModelSpec(num_layers=row["layers"], hidden_size=row["hidden_size"],
                      num_attention_heads=row["attention_heads"],
                      num_query_groups=QUERY_GROUPS, vocab_size=VOCAB, seq_length=seq,
                      tied=False)
    return PlanConfig(model=model, cluster=PRESETS["a100"], gpus=gpus or int(row["gpus"]),
                      global_batch=row["batch_size"], lengths=np.full(64, seq),
                      memory_gb=MEMORY_GB, samples=1)


def _resolve(option, *, d: int, v: int) -> int:
    return {"v": v, "d": d, "1": 1, "ceil(v/2)": math.ceil(v / 2),
            "ceil(d/2)": math.ceil(d / 2)}[option]


def options_of(schedule: str) -> str:
    """The ``offloaded`` option of paper ``schedule``."""
    return SCHEDULES[schedule][1]["offloaded"]


def cell_candidate(row: dict, schedule: str, *, v: int, tp: int = 1, pp: int | None = None):
    """(Candidate, layout_exact) of paper ``schedule`` for Table 2 ``row`` with ``v``
    stages per device (NotExpressible where odc-pp cannot run it yet)."""
    from odc_pp.planner.search import Candidate
    from odc_pp.schedule.generators import family

    if schedule not in SCHEDULES:
        raise KeyError(f"unknown paper schedule {schedule!r}; known: {', '.join(SCHEDULES)}")
    name, options = SCHEDULES[schedule]
    pp = pp or int(row["gpus"]) // tp
    fields, extra = _fields(), {}
    chunks = _resolve(options["chunks"], d=pp, v=v) if "chunks" in options else 1
    if "group" in options:
        if GROUP_FIELD not in fields:
            raise NotExpressible(f"{schedule} needs the group-interleaved schedule "
                                 f"(group {options['group']} with split backward; "
                                 f"--microbatch-group-size-per-virtual-pipeline-stage)")
        extra[GROUP_FIELD] = _resolve(options["group"], d=pp, v=v)
    if chunks != family(name).default_chunks:
        if CHUNKS_FIELD not in fields:
            raise NotExpressible(f"{schedule} runs {chunks} chunks per device; the planner "
                                 f"prices {name} at {family(name).default_chunks} only")
        extra[CHUNKS_FIELD] = chunks
    if "offloaded" in options:
        extra["offload_chunks"] = tuple(range(_resolve(options["offloaded"], d=pp, v=v)))
    if options.get("selective"):
        extra["selective_offload"] = True
    # one layer off the first and the last (virtual) stage (Section 5): Megatron's
    # --account-for-embedding/loss-in-pipeline-split, whatever v (zero-layer ends allowed)
    exact = (row["layers"] + 2) % (pp * chunks) == 0
    layout = {"accounted": (True, True)}
    if not exact:  # the nearest layout Megatron accepts (the planner's chunk axis)
        from odc_pp.planner.chunks import chunk_layouts

        options = chunk_layouts(name, row["layers"], pp)
        if not options:
            raise NotExpressible(f"{row['layers']} layers do not split over pp {pp}")
        v_, ends, accounted = next((o for o in options if o[0] == chunks), options[0])
        layout = {"accounted": accounted, "uneven": ends}
        if extra.get(CHUNKS_FIELD, chunks) != v_ or "offload_chunks" in extra:
            extra[CHUNKS_FIELD] = v_
            if "offload_chunks" in extra:
                extra["offload_chunks"] = tuple(range(_resolve(options_of(schedule), d=pp,
                                                               v=v_)))
    cand = Candidate(tp=tp, pp=pp, dp=1, schedule=name, dp_mode="ddp", balance="none",
                     packed=False, token_cap=None, recompute=True, **layout, **extra)
    return cand, exact


@functools.lru_cache(maxsize=None)
def _rank_memory():
    from odc_pp.planner.hardware import GB
    from odc_pp.training.plan_memory import rank_peaks

    return functools.partial(rank_peaks, budget_bytes=MEMORY_GB * GB)


def price(config, cand) -> dict:
    """The planner's MFU (%), activation memory (GB, max over ranks of peak - state),
    step seconds and the dry-run model's 80 GB verdict of one candidate."""
    from odc_pp.planner.hardware import GB
    from odc_pp.planner.rough_memory import static_bytes
    from odc_pp.planner.search import predict

    try:
        pred = predict(config, cand)
    except ValueError as exc:  # the planner refuses the layout (e.g. more stages than layers)
        raise NotExpressible(f"the planner refuses it: {exc}") from None
    activation = max(p * GB - s for p, s in zip(pred.peak_memory_gb,
                                                 static_bytes(config, cand))) / GB
    out = {"mfu_pct": round(100 * pred.mfu, 2), "activation_gb": round(activation, 2),
           "step_s": round(pred.step_s, 3), "fits_planner_formula": pred.fits,
           "flags": pred.flags}
    try:
        dry = predict(dataclasses.replace(config, rank_memory=_rank_memory()), cand)
        out.update(fits=dry.fits, dry_run_peak_gb=max(dry.peak_memory_gb))
    except (ValueError, SystemExit) as exc:  # the dry run's parser rejects the flags
        out.update(fits=None, dry_run_error=str(exc) or type(exc).__name__)
    return out


def figure15_cells(paper: dict, models: list[str] | None = None) -> list[dict]:
    """One entry per Figure 15 cell: the paper's values and odc-pp's prediction (or why
    it cannot be expressed)."""
    fig = paper["figure15"]
    cells = []
    for name, by_schedule in fig["mfu_pct"].items():
        if models and name not in models:
            continue
        row, v = model_row(paper, name), fig["stages_per_device_v"]["value"][name]
        for schedule, mfus in by_schedule.items():
            for i, seq in enumerate(fig["seq"]):
                cell = {"model": name, "seq": seq, "schedule": schedule,
                        "paper_mfu_pct": mfus[i],
                        "paper_activation_gb": fig["activation_gb"][name][schedule][i]}
                if cell["paper_mfu_pct"] == "SKIP":
                    cells.append(dict(cell, expressible=False, paper_skipped=True))
                    continue
                try:
                    cand, exact = cell_candidate(row, schedule, v=1 if schedule == "1F1B" else v)
                    cell.update(expressible=True, layout_exact=exact,
                                predicted=price(plan_config(row, seq), cand))
                except NotExpressible as exc:
                    cell.update(expressible=False, reason=str(exc))
                cells.append(cell)
    return cells


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def memory_errors(cells: list[dict]) -> list[float]:
    """Signed activation-memory errors (%) of the cells where both sides have a number."""
    return [100 * (c["predicted"]["activation_gb"] - c["paper_activation_gb"]) /
            c["paper_activation_gb"] for c in cells
            if c.get("expressible") and _number(c["paper_activation_gb"])]


def oom_agreement(cells: list[dict]) -> tuple[int, int]:
    """(agreeing, compared) fits verdicts: the paper ran (a number) or hit a GPU OOM
    ('OOM'); SKIP, host OOM and cells without a dry-run verdict are left out."""
    agree = total = 0
    for c in cells:
        paper = c["paper_mfu_pct"]
        if not c.get("expressible") or c["predicted"].get("fits") is None or \
                not (_number(paper) or paper == "OOM"):
            continue
        total += 1
        agree += c["predicted"]["fits"] == _number(paper)
    return agree, total


def order_agreement(cells: list[dict]) -> tuple[int, int]:
    """(agreeing, compared) pairs of schedules within each (model, seq) row whose paper
    MFU and predicted MFU order the pair the same way; a tie on either side disagrees."""
    rows: dict[tuple, list[dict]] = {}
    for c in cells:
        if c.get("expressible") and _number(c["paper_mfu_pct"]):
            rows.setdefault((c["model"], c["seq"]), []).append(c)
    agree = total = 0
    for row in rows.values():
        for i, a in enumerate(row):
            for b in row[i + 1:]:
                paper = np.sign(a["paper_mfu_pct"] - b["paper_mfu_pct"])
                ours = np.sign(a["predicted"]["mfu_pct"] - b["predicted"]["mfu_pct"])
                total += 1
                agree += bool(paper != 0 and paper == ours)
    return agree, total


def max_mfu_error(cells: list[dict]) -> float | None:
    """Largest |predicted - paper| MFU in points over the cells with both."""
    errors = [abs(c["predicted"]["mfu_pct"] - c["paper_mfu_pct"]) for c in cells
              if c.get("expressible") and _number(c["paper_mfu_pct"])]
    return round(max(errors), 2) if errors else None


def summarize(cells: list[dict]) -> dict:
    """The Figure 15 metrics of ``cells`` (see the module docstring)."""
    errors = memory_errors(cells)
    (oom_ok, oom_n), (order_ok, order_n) = oom_agreement(cells), order_agreement(cells)
    by_schedule = {}
    for name in SCHEDULES:
        mine = memory_errors([c for c in cells if c["schedule"] == name])
        if mine:
            by_schedule[name] = round(statistics.median(mine), 1)
    return {"cells": len(cells), "expressible": sum(bool(c.get("expressible")) for c in cells),
            "layout_exact": sum(bool(c.get("layout_exact")) for c in cells),
            "paper_skipped": sum(bool(c.get("paper_skipped")) for c in cells),
            "not_expressible": sorted({c["reason"] for c in cells if "reason" in c}),
            "memory_cells": len(errors),
            "median_abs_memory_error_pct": round(statistics.median(map(abs, errors)), 1)
            if errors else None,
            "median_memory_error_pct_by_schedule": by_schedule,
            "oom_agreement": [oom_ok, oom_n],
            "oom_agreement_fraction": round(oom_ok / oom_n, 3) if oom_n else None,
            "mfu_order_agreement": [order_ok, order_n],
            "mfu_order_agreement_fraction": round(order_ok / order_n, 3) if order_n else None,
            "max_abs_mfu_error_points": max_mfu_error(cells)}


BASELINE_CHUNKS = (2, 4, 8)
"""Chunks per device tried for Section 5.4's TP8 x PP4 interleaved baseline (the paper
does not state its own): the fastest that fits is the baseline, so the comparison is
against the best interleaved layout the planner knows, not a weak one."""


def _best_baseline(row: dict, seq: int) -> dict:
    """The priced TP8 x PP4 interleaved candidate (+SP) that fits and is fastest (the
    fastest when none fits)."""
    priced = []
    for v in BASELINE_CHUNKS:
        try:
            base, _ = cell_candidate(row, "1F1B-I", v=v, tp=8, pp=4)
            priced.append({**price(plan_config(row, seq), base), "chunks": v})
        except (NotExpressible, ValueError):
            continue
    if not priced:
        raise NotExpressible(f"{row['model']}: no TP8 x PP4 interleaved layout splits")
    return min(priced, key=lambda p: (not p.get("fits"), p["step_s"]))


def section_5_4(paper: dict) -> list[dict]:
    """Section 5.4: predicted speed-up of PP32 with PO-F / PO-H over TP8 x PP4
    interleaved (:func:`_best_baseline`), against the paper's 12-19%."""
    sec, out = paper["section_5_4"], []
    for comp in sec["comparisons"]:
        row = model_row(paper, comp["model"])
        v = (row["layers"] + 2) // row["gpus"] if (row["layers"] + 2) % row["gpus"] == 0 \
            else None  # the paper's stages per device where each stage holds one layer
        entry = {**comp, "paper_speedup_range": sec["speedup_range"], "po_v": v}
        try:
            baseline = _best_baseline(row, comp["seq"])
            entry["tp8_pp4"] = {k: baseline[k] for k in ("mfu_pct", "activation_gb", "step_s",
                                                         "fits", "dry_run_error", "chunks")
                                if k in baseline}
            for name in ("PO-F", "PO-H"):
                try:
                    cand, _ = cell_candidate(row, name, v=v or 2)
                    ours = price(plan_config(row, comp["seq"]), cand)
                except NotExpressible as exc:
                    entry[name] = {"expressible": False, "reason": str(exc)}
                    continue
                entry[name] = {"mfu_pct": ours["mfu_pct"], "activation_gb": ours["activation_gb"],
                               "step_s": ours["step_s"], "fits": ours["fits"],
                               "predicted_speedup": round(baseline["step_s"] / ours["step_s"], 3),
                               "v_assumed": v is None}
        except NotExpressible as exc:
            entry.update(expressible=False, reason=str(exc))
        out.append(entry)
    return out


def section(models: list[str] | None = None) -> dict:
    """The ``pipeoffload`` section (mergeable into planner_validation.json)."""
    paper = _load()
    cells = figure15_cells(paper, models)
    return {"source": paper["source"]["paper"], "data": "benchmarks/data/pipeoffload_paper.json",
            "method": __doc__.split("\n\n")[1].replace("\n", " "),
            "summary": summarize(cells), "section_5_4": section_5_4(paper), "cells": cells}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the JSON document")
    parser.add_argument("--output", default=None, help="write the document here")
    parser.add_argument("--update", default=None, metavar="FILE",
                        help="set the 'pipeoffload' section of an existing JSON document "
                             "(benchmarks/results/planner_validation.json)")
    parser.add_argument("--models", default=None,
                        help="comma-separated Figure 15 models (default: all)")
    args = parser.parse_args(argv)
    result = section(args.models.split(",") if args.models else None)
    doc = {"benchmark": "pipeoffload_validation", "pipeoffload": result}
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            json.dump(doc, handle, indent=1)
            handle.write("\n")
    if args.update:
        with open(args.update, encoding="utf-8") as handle:
            existing = json.load(handle)
        existing["pipeoffload"] = result
        with open(args.update, "w", encoding="utf-8") as handle:
            json.dump(existing, handle, indent=1)
            handle.write("\n")
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print(json.dumps(result["summary"], indent=1))
        for entry in result["section_5_4"]:
            print(entry["model"], entry["seq"], {k: entry.get(k, {}).get("predicted_speedup")
                                                 for k in ("PO-F", "PO-H")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
