"""Calibrate the two-rank validation's model from pretrain_gpt.py's own trace (issue 31).

:func:`benchmarks.planner_measure.calibrate` times the pipeline runtime on hand-made
microbatches. The training loop pays more per microbatch (its masks, loss and hooks, the
data-parallel engine beside it, the ranks contending as they do in the measured runs) and
per step (the ODC sync, the loss all-reduce, the optimizer). So here one short
``pretrain_gpt.py --trace`` run per mode, on its own seed (data the validated rows do
not see), is read back:

* per microbatch, the F + B + W of this rank less any wait for a peer, against the shape
  the run planned (``BatchAssigner``, deterministic): the fit ``a`` (per token^2), ``b``
  (per token), ``c`` (per microbatch) and the F : B : W shares. In a pipeline ``c`` is
  split into what does not grow with the virtual stages (``c_rank``: each rank pays its
  share once per microbatch) and what each virtual stage pays (``c_stage``);
* per step, what the iteration spends outside its actions' span: the optimizer, the sync
  and the reductions. Per rank its step less its own action span; the smallest over the
  ranks (the others wait there for the slowest);
* in a pipeline, each SEND/RECV action's own time (the stage transfer on gloo, CPU-bound).

The first iteration is a warm-up and is left out.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from collections import defaultdict
from pathlib import Path

__all__ = ["CALIBRATION_RUNS", "calibrate_from_training", "calibration_flags",
           "fit_calibration", "planned_shapes", "read_trace", "split_fixed",
           "traced_run"]

CALIBRATION_SEED = "97"
"""The calibration runs' seed: other documents than the validated rows' (seed 11)."""
CALIBRATION_RUNS = {
    "odc": ["--dp-mode", "odc", "--load-balance", "none"],
    "collective": ["--dp-mode", "collective", "--load-balance", "none"],
    "pipeline": ["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "zb-h1"],
    "pipeline_chunks": ["--pipeline-model-parallel-size", "2", "--pipeline-schedule",
                        "interleaved"],
}
"""One calibration run per mode of the validated rows (2 ranks each); the pipeline twice,
with 2 and with 4 virtual stages, to tell the part of a microbatch's fixed cost that does
not grow with the virtual stages from the part each virtual stage pays
(:func:`split_fixed`)."""


def read_trace(path: str) -> dict:
    """``{rank: {iteration: record}}`` from a ``--trace`` file. A record: ``step_s``,
    ``busy`` (``{microbatch: {kind: seconds}}``, each action less its wait), ``span_s``
    (first action's start to last action's end) and ``p2p_s`` (``send``/``recv``: each
    such action's duration less its wait)."""
    events = json.loads(Path(path).read_text())["traceEvents"]
    out: dict = defaultdict(lambda: defaultdict(lambda: {
        "busy": defaultdict(lambda: defaultdict(float)), "p2p_s": defaultdict(list),
        "bounds": []}))
    for event in events:
        if event.get("ph") != "X":
            continue
        args, record = event["args"], out[event["pid"]][event["args"]["iteration"]]
        seconds = event["dur"] / 1e6
        if event["cat"] == "iteration":
            record["step_s"] = seconds
        elif event["cat"] == "compute":
            kind = event["name"].split()[0]
            record["busy"][args["microbatch"]][kind] += seconds - args["waited_ms"] / 1e3
            record["bounds"] += [event["ts"] / 1e6, (event["ts"] + event["dur"]) / 1e6]
        elif event["cat"] in ("send_f", "send_b", "recv_f", "recv_b"):
            record["p2p_s"][event["cat"][:4]].append(seconds - args["waited_ms"] / 1e3)
            record["bounds"] += [event["ts"] / 1e6, (event["ts"] + event["dur"]) / 1e6]
    for ranks in out.values():
        for record in ranks.values():
            bounds = record.pop("bounds")
            record["span_s"] = max(bounds) - min(bounds) if bounds else 0.0
    return out


def planned_shapes(planner, source, groups) -> list[tuple[int, int]]:
    """``(rows, tokens)`` of each microbatch of one replica's ``groups`` as the run
    builds them: a packed row holds its samples back to back, an unpacked microbatch pads
    to its longest sample."""
    return [(1, sum(source.length(i) for i in g)) if planner.packed
            else (len(g), max(source.length(i) for i in g)) for g in groups]


def _planned_run(flags: list[str], iterations: range) -> tuple[dict, int, int]:
    """``({(iteration, dp_rank): shapes}, pp, virtual stages)`` of a two-rank run of
    ``flags`` as it plans (:func:`planned_shapes`)."""
    from odc_pp.training.arguments import parse_args
    from odc_pp.training.data_plan import BatchAssigner, build_source

    job = parse_args(flags).resolve(2)
    args, dp, pp = job.args, job.layout.dp, job.layout.pp
    source, _ = build_source(args)
    planner = BatchAssigner(args, source, dp=dp, pp=pp)
    shapes = {(iteration, replica): planned_shapes(planner, source, groups)
              for iteration in iterations
              for replica, groups in enumerate(planner.plan(iteration).replicas)}
    return shapes, pp, pp * args.schedule.num_model_chunks


def _fit_mode(flags: list[str], traces: list[dict], iters: int) -> dict:
    """The fit and fixed costs of the calibration runs ``traces`` of ``flags`` (see the
    module docstring), their points pooled."""
    from odc_pp.data.load_balance import fit_microbatch_costs

    # plan() counts iterations from 0, the trace from 1
    shapes, pp, stages = _planned_run(flags, range(1, iters))
    linear, quadratic, times, kinds = [], [], [], defaultdict(float)
    p2p: dict[str, list[float]] = defaultdict(list)
    per_rank_fixed: dict[tuple[int, int], list[float]] = defaultdict(list)
    for run, rank, iterations in ((n, r, i) for n, trace in enumerate(traces)
                                  for r, i in trace.items()):
        replica = 0 if pp > 1 else rank
        for iteration, record in iterations.items():
            if iteration < 2:  # warm-up
                continue
            for microbatch, busy in record["busy"].items():
                rows, tokens = shapes[(iteration - 1, replica)][microbatch]
                linear.append(rows * tokens)
                quadratic.append(rows * tokens * tokens)
                times.append(sum(busy.values()))
                for kind, seconds in busy.items():
                    kinds[kind] += seconds
            per_rank_fixed[(run, iteration)].append(record["step_s"] - record["span_s"])
            for direction, seconds in record["p2p_s"].items():
                p2p[direction] += seconds
    fit = fit_microbatch_costs(linear, quadratic, times, with_constant=True)
    fixed = [min(values) for values in per_rank_fixed.values()]
    total = sum(kinds.values())
    kinds["B"] += kinds.pop("BW", 0.0)  # without a pipeline B and W run fused (BW)
    shares = {k: kinds.get(k, 0.0) / total for k in ("F", "B", "W")}
    # a rank's fit covers its chunks of a microbatch: the whole model is pp ranks of it
    return {"a": fit.a * pp, "b": fit.b * pp, "c_stage": fit.c * pp / stages,
            "stages": stages,
            "shares": shares, "fixed_s": statistics.median(fixed),
            "send_s": statistics.median(p2p["send"]) if p2p["send"] else 0.0,
            "recv_s": statistics.median(p2p["recv"]) if p2p["recv"] else 0.0,
            "microbatches": len(times)}


def split_fixed(two: dict, four: dict) -> tuple[float, float]:
    """``(fixed, per virtual stage)`` seconds of a microbatch's fixed cost from the fits
    of a pipeline with 2 and with 4 virtual stages: the whole model's fixed cost is
    ``fixed + stages x stage``, so the two runs give both (neither below 0). Where the
    ``fixed`` part falls the two runs cannot tell (in both it falls on both ranks
    alike): :func:`~benchmarks.planner_measure.predict` shares it over the ranks."""
    total_two = two["c_stage"] * two["stages"]  # the whole model's, per microbatch
    total_four = four["c_stage"] * four["stages"]
    per_stage = max(0.0, (total_four - total_two) / (four["stages"] - two["stages"]))
    fixed = max(0.0, total_two - two["stages"] * per_stage)
    return fixed, per_stage


def calibration_flags(model: list[str], mode: str) -> list[str]:
    """The flags of ``mode``'s calibration run: ``model`` with the calibration seed."""
    base = list(model)
    if "--seed" in base:
        base[base.index("--seed") + 1] = CALIBRATION_SEED
    return base + CALIBRATION_RUNS[mode]


def traced_run(flags: list[str], iters: int) -> dict:
    """One two-rank ``pretrain_gpt.py --trace`` run of ``flags``: :func:`read_trace`'s
    record of it."""
    from odc_pp.testing.torchrun import launch

    with tempfile.TemporaryDirectory() as tmp:
        trace = str(Path(tmp) / "calibration.json")
        run = launch(flags + ["--train-iters", str(iters), "--trace", trace], nproc=2,
                     tmp_path=Path(tmp), name="calibrate", timeout=1800, launcher="torchrun")
        if run.returncode != 0:
            raise RuntimeError(run.describe())
        return read_trace(trace)


def fit_calibration(model: list[str], traces: dict[str, list[dict]], iters: int) -> dict:
    """Per :data:`CALIBRATION_RUNS` mode the fit of its runs' ``traces`` pooled
    (:func:`_fit_mode`), and the pipeline's fixed cost split (:func:`split_fixed`)."""
    out = {}
    for mode, runs in traces.items():
        out[mode] = _fit_mode(calibration_flags(model, mode), runs, iters)
        out[mode]["flags"] = CALIBRATION_RUNS[mode] + ["--seed", CALIBRATION_SEED]
        out[mode]["runs"] = len(runs)
    if "pipeline" in out and "pipeline_chunks" in out:
        out["pipeline"]["c_rank"], out["pipeline"]["c_stage"] = split_fixed(
            out["pipeline"], out["pipeline_chunks"])
    return out


def calibrate_from_training(model: list[str], *, iters: int = 6) -> dict:
    """One traced two-rank run per :data:`CALIBRATION_RUNS` mode of ``model``'s flags
    (their seed replaced by :data:`CALIBRATION_SEED`), fitted by
    :func:`fit_calibration`. ``bench_planner_validation.py --measure`` instead runs them
    in every round beside the measured rows (drift hits both alike)."""
    traces = {mode: [traced_run(calibration_flags(model, mode), iters)]
              for mode in CALIBRATION_RUNS}
    return fit_calibration(model, traces, iters)
