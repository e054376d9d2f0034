"""``odc-pp schedule``: build, simulate, render or compare pipeline schedules."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys

from .cli_bounds import (MAX_CHUNKS, MAX_MICROBATCHES, MAX_PP, MAX_TIME, MAX_WORK,
                         bounded_float, bounded_int, check_work)
from .build import PLANNED_CHUNKS, ScheduleRequest, build
from .compare import compare_schedules, family_names, format_table
from .costs import CostModel
from .generators.families import family
from .simulator import OBJECTIVES, simulate

__all__ = ["main", "build_parser", "flag_names", "FLAG_OF"]


class _UsageError(Exception):
    """Bad command-line input: reported as ``error: ...`` with exit code 2."""


FLAG_OF = {"num_microbatches": "--microbatches", "num_chunks": "--chunks",
           "memory_limit": "--memory-limit", "mem_f": "--mem-f", "mem_b": "--mem-b",
           "mem_w": "--mem-w", "t_f": "--cost-f", "t_b": "--cost-b", "t_w": "--cost-w",
           "t_comm": "--cost-comm", "offload_bandwidth": "--offload-bandwidth",
           "group_size": "--microbatch-group-size-per-virtual-pipeline-stage"}
"""The schedule library's names (shared with training, whose flags differ) -> this
command's flags, for its error messages."""

_NAMES = re.compile(r'(?<!["\w-])(' + "|".join(FLAG_OF) + r')(?![\w"])( \(--[\w-]+\))?')


def flag_names(message: str) -> str:
    """``message`` with the library's names replaced by this command's flags."""
    return _NAMES.sub(lambda match: FLAG_OF[match.group(1)], message)


def _numbers(text: str) -> float | list[float]:
    """``1.5`` or a comma-separated per-stage list ``1.5,1,1,1.5`` of finite times >= 0."""
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number or a comma-separated list of numbers") from None
    bad = [v for v in values if not math.isfinite(v) or not 0 <= v <= MAX_TIME]
    if bad:
        raise argparse.ArgumentTypeError(
            f"{text!r}: times must be finite numbers in [0, {MAX_TIME:g}], got {bad[0]}")
    return values[0] if len(values) == 1 else values


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="odc-pp schedule",
        description="Generate or search a pipeline schedule, simulate it, render it, "
                    "or compare all families (--compare).")
    parser.add_argument("--schedule", default="zb-auto", choices=family_names(),
                        metavar="NAME",
                        help=f"family: {', '.join(family_names())} (default zb-auto)")
    parser.add_argument("--pp", type=bounded_int(1, MAX_PP), required=True,
                        help=f"pipeline ranks (at most {MAX_PP}; pp x microbatches x chunks "
                             f"at most {MAX_WORK})")
    parser.add_argument("--microbatches", type=bounded_int(1, MAX_MICROBATCHES), required=True,
                        help=f"microbatches per minibatch (at most {MAX_MICROBATCHES})")
    parser.add_argument("--chunks", type=bounded_int(1, MAX_CHUNKS), default=None,
                        help="model chunks per rank (default: the family's own)")
    parser.add_argument("--cost-f", type=_numbers, default=1.0,
                        help="forward time: one number or a comma list per rank/stage")
    parser.add_argument("--cost-b", type=_numbers, default=1.0, help="input-grad time")
    parser.add_argument("--cost-w", type=_numbers, default=1.0, help="weight-grad time")
    parser.add_argument("--cost-comm", type=bounded_float(0, MAX_TIME), default=0.0,
                        help="transfer latency")
    parser.add_argument("--memory-limit", type=bounded_float(0, 1e9, open_low=True),
                        default=None, help="activation limit per rank in microbatch-chunks")
    parser.add_argument("--offload-bandwidth", type=bounded_float(0, 1e12, open_low=True),
                        default=None,
                        help="host link: microbatch-chunk activations per time unit")
    parser.add_argument("--mem-f", type=bounded_float(-1e6, 1e6), default=1.0,
                        help="activation delta of F in microbatch-chunk units (default 1)")
    parser.add_argument("--mem-b", type=bounded_float(-1e6, 1e6), default=0.0,
                        help="activation delta of B (default 0; the zero-bubble paper's "
                             "model: -(1 - r), B frees what W does not need)")
    parser.add_argument("--mem-w", type=bounded_float(-1e6, 1e6), default=-1.0,
                        help="activation delta of W (default -1; the paper's: -r); "
                             "the three must sum to 0")
    parser.add_argument("--objective", choices=OBJECTIVES, default="span",
                        help="what zb-auto minimises: span = longest per-stage span, the "
                             "iteration time when post-validation overlaps iterations "
                             "(default); makespan = for runs that synchronise before the "
                             "optimizer step")
    parser.add_argument("--max-evaluations", type=bounded_int(1, 10 ** 6), default=None,
                        help="candidates zb-auto scores (default: scaled to pp x "
                             "microbatches); the result depends only on the inputs")
    parser.add_argument("--fill-gaps", type=bounded_int(0, 10 ** 6), default=0,
                        help="move W's into the schedule's idle gaps under these costs, "
                             "scoring at most this many candidate moves (0: off; training's "
                             "--fill-pipeline-gaps uses 3000; not with offload)")
    parser.add_argument("--microbatch-group-size-per-virtual-pipeline-stage", type=bounded_int(
        1, MAX_MICROBATCHES), default=None, dest="group_size",
                        help="microbatches per model chunk at a time (Megatron's flag): "
                             "interleaved >= pp; gis/offload 1..pp (PipeOffload's order)")
    parser.add_argument("--selective-offload", action="store_true",
                        help="with --lower: offload only the passes long-lived enough to "
                             "hide the transfers (PipeOffload's selective offload)")
    parser.add_argument("--lower", action="store_true",
                        help="insert explicit SEND/RECV (and offload) before simulating")
    parser.add_argument("--compare", action="store_true",
                        help="table of every family for this setting")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--render", choices=("ascii", "svg", "png"), default=None)
    parser.add_argument("--output", default=None,
                        help="file for --render (required for png and with --json)")
    parser.add_argument("--width", type=bounded_int(20, 100000), default=120,
                        help="columns of --render ascii")
    return parser


def _costs(args) -> CostModel:
    return CostModel(t_f=args.cost_f, t_b=args.cost_b, t_w=args.cost_w,
                     t_comm=args.cost_comm, offload_bandwidth=args.offload_bandwidth,
                     mem_f=args.mem_f, mem_b=args.mem_b, mem_w=args.mem_w)


def _run_compare(args, costs: CostModel) -> int:
    rows = compare_schedules(args.pp, args.microbatches, costs,
                             memory_limit=args.memory_limit, objective=args.objective,
                             max_evaluations=args.max_evaluations)
    for row in rows:  # a family's refusal, in this command's flags
        if "error" in row:
            row["error"] = flag_names(row["error"])
    if args.json:
        print(json.dumps({"pp": args.pp, "microbatches": args.microbatches,
                          "memory_limit": args.memory_limit, "rows": rows}))
    else:
        print(format_table(rows))
    return 0


def _render(args, schedule, sim) -> None:
    from . import render
    if args.render == "png":
        if not args.output:
            raise _UsageError("--render png needs --output FILE.png")
        render.render_png(schedule, sim, args.output)
        return
    text = (render.render_ascii(schedule, sim, width=args.width) if args.render == "ascii"
            else render.render_svg(schedule, sim))
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")
    elif args.json:
        raise _UsageError(f"--render {args.render} with --json needs --output FILE")
    else:
        print(text)


def _report(args, schedule, sim) -> dict:
    return {
        "schedule": schedule.name, "pp": schedule.pp,
        "microbatches": schedule.num_microbatches, "chunks": schedule.num_chunks,
        "placement": schedule.placement.value, "makespan": sim.makespan,
        "max_stage_span": sim.max_stage_span, "span": sim.span,
        "bubble_rate": sim.bubble_rate, "makespan_bubble_rate": sim.makespan_bubble_rate,
        "per_rank_bubble": sim.per_rank_bubble,
        "peak_activation": sim.peak_activation, "memory_limit": args.memory_limit,
        "fits_memory": sim.fits_memory, "comm_overlap": sim.comm_overlap,
        "offload_overlap": sim.offload_overlap,
        "search_seconds": float(schedule.meta.get("search_seconds", 0.0)),
        "objective": schedule.meta.get("objective"),
        "evaluations": schedule.meta.get("evaluations"),
        "lower_bound": schedule.meta.get("lower_bound"), "lowered": bool(args.lower),
        "gap_fill": schedule.meta.get("gap_fill"),
        "memory_deltas": {"F": args.mem_f, "B": args.mem_b, "W": args.mem_w},
        "digest": schedule.digest(),
        "actions": [a.to_dict() for a in schedule.actions()],
    }


def _run_one(args, costs: CostModel) -> int:
    request = ScheduleRequest.of(
        args.schedule, pp=args.pp, num_microbatches=args.microbatches, num_chunks=args.chunks,
        memory_limit=args.memory_limit,
        search={"objective": args.objective, "max_evaluations": args.max_evaluations},
        fill_gaps=args.fill_gaps, group_size=args.group_size,
        selective_offload=args.selective_offload,
        offload=PLANNED_CHUNKS if args.lower else (), assumed_offload_bandwidth=None,
        communication=bool(args.lower))
    schedule = build(request, costs)
    sim = simulate(schedule, costs, memory_limit=args.memory_limit)
    if args.render:
        _render(args, schedule, sim)
    if args.json:
        print(json.dumps(_report(args, schedule, sim)))
    elif not args.render or args.output:
        print(f"{schedule.name}: pp={schedule.pp} microbatches={schedule.num_microbatches} "
              f"chunks={schedule.num_chunks} makespan={sim.makespan:.4f} "
              f"bubble={sim.makespan_bubble_rate:.4%} max_stage_span={sim.max_stage_span:.4f} "
              f"span_bubble={sim.bubble_rate:.4%} "
              f"peak_activation={sim.peak_activation}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``odc-pp schedule``; returns the exit code (2 on bad input)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed usage/error (or --help)
        return int(exc.code or 0)
    try:
        chunks = args.chunks or (max(family(name).default_chunks for name in family_names())
                                 if args.compare else family(args.schedule).default_chunks)
        check_work(args.pp, args.microbatches, chunks)
        costs = _costs(args)
        return _run_compare(args, costs) if args.compare else _run_one(args, costs)
    except (ValueError, _UsageError) as exc:
        print(f"{parser.prog}: error: {flag_names(str(exc))}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
