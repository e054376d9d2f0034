"""Item 6b of issue 22: the planner's pipeline model against measured two-rank runs on
this machine (``bench_planner_validation.py --measure``). Quiet machine only: 2 ranks, 1
thread each, a compute-dominated shape (results: planner_validation.json this_machine).

1. Calibrate once per machine, from the profiler, with the contention of the ranks that
   will run and the allocator settings of CPU training (``keep_freed_host_memory``;
   without them the page faults of large activations inflated the token^2 term 1.8x):
   * for dp = 2 (pp = 1): two processes at once (:func:`calibrate_contended`), each
     running the whole model (zb-h1 so B and W are timed apart) on microbatches of
     several shapes; the two fits are averaged;
   * for pp = 2: a real two-stage zb-h1 pipeline (:func:`calibrate_pipeline`), each rank
     fitting its own stage; the token terms add up over the stages, and the per-row
     constant is charged per virtual stage.
   :meth:`Profiler.sample_cost_model` fits seconds per token, per token^2 and per row of
   a microbatch; the profiler's per-kind means give the F : B : W split, and an AdamW
   step is timed (a rank steps 1/(pp x dp) of the model after its minibatch), and so is a
   two-rank gloo reduce-scatter of the model's gradients (collective mode pushes one
   after every microbatch; its replicas run at most ``max_inflight_pushes`` microbatches
   apart, :func:`_data_parallel_step`).
2. For each configuration (pp/dp, schedule, dp mode, load balance, length distribution),
   the prediction uses the exact plans pretrain_gpt.py makes (``BatchAssigner``) and the
   schedule it builds (``training_request``), simulated with the calibrated costs per
   replica (ODC: the slowest replica; collective: lock step).
3. Rounds alternate the configurations (the order rotates between rounds); each runs
   pretrain_gpt.py on 2 ranks with ``OMP_NUM_THREADS=1``; the first iteration is a
   warm-up. Reported per configuration: the mean predicted and measured step over the
   same iterations (each iteration's measured time is its median over the rounds), the
   min-max, the error and the load average before each run; overall median and worst
   error.

Each microbatch is simulated at its own cost (``CostModel.microbatch_scale``), so uneven
lengths leave the bubbles they make. Where the calibration holds pretrain_gpt.py's own
traces (:mod:`benchmarks.planner_trace`, one run per mode on another seed), those fits
are used instead: per microbatch what the training loop pays (masks, loss, hooks, the
engine beside it; collective mode: ODC's fit plus its measured reduce-scatter after every
microbatch), per step what it spends outside its actions (optimizer, ODC sync, loss
all-reduce), each stage transfer's CPU time, and a microbatch's fixed cost
split into what every virtual stage pays and what does not grow with them (shared over
the ranks). Not modelled: the embedding's and output layer's
token-dependent costs apart from the layers' (spread evenly over the stages).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

from odc_pp.testing.bench import load_1min, rotated

ROOT = str(Path(__file__).resolve().parents[1])
from odc_pp.testing.torchrun import launch

MODEL = ["--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "4",
         "--mock-data", "--vocab-size", "512", "--global-batch-size", "16",
         "--lr", "1e-4", "--no-progress-bar", "--seed", "11"]
CONFIGS = {  # name -> flags (2 ranks each)
    "pp2-1f1b": ["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "1f1b"],
    "pp2-zb-h1": ["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "zb-h1"],
    "pp2-zb-h2": ["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "zb-h2"],
    "pp2-zbv": ["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "zbv"],
    "pp2-interleaved": ["--pipeline-model-parallel-size", "2", "--pipeline-schedule",
                        "interleaved"],
    "dp2-collective-none": ["--dp-mode", "collective", "--load-balance", "none"],
    "dp2-collective-balanced": ["--dp-mode", "collective", "--load-balance", "balanced"],
    "dp2-odc-balanced": ["--dp-mode", "odc", "--load-balance", "balanced"],
    "dp2-odc-lb-mini-packed": ["--dp-mode", "odc", "--load-balance", "lb-mini"],
    "dp2-odc-lb-mini-padded": ["--dp-mode", "odc", "--load-balance", "lb-mini",
                               "--no-pack-sequences", "--micro-batch-size", "2"],
}
LENGTHS = {"seq1024": ["--seq-length", "1024"], "seq512": ["--seq-length", "512"]}
"""Two length distributions of the mock corpus (log-normal, median seq/4, clipped)."""
MEASURED = [f"{c}/seq1024" for c in CONFIGS] + [
    f"{c}/seq512" for c in ("pp2-1f1b", "pp2-zbv", "dp2-collective-balanced",
                            "dp2-odc-lb-mini-packed")]
"""The 14 measured (configuration, distribution) pairs: every configuration at seq 1024,
and a pipeline and a data-parallel pair at seq 512 (the budget of one quiet-machine run)."""


def calibrate(seq_length: int = 1024, group=None, pp: int = 1) -> dict:
    """(a, b, c, shares, optimizer_s) from the profiler on one process (pp = 1; ``group``:
    its own one-rank process group, default: a new one), or on this rank's stage of a
    pipeline over the default group (``pp`` = its size). ``optimizer_s``: one AdamW
    step over this rank's parameters (torch's default CPU implementation), the median
    of 5."""
    import time

    import torch
    import torch.distributed as dist

    from odc_pp.data import Microbatch
    from odc_pp.training.distributed import standalone_process_groups
    from odc_pp.megatron.model import ModelConfig, build_chunks
    from odc_pp.runtime import PipelineRuntime, Profiler, ProfilerConfig, RuntimeConfig
    from odc_pp.schedule.generators import generate
    from odc_pp.schedule.lowering import lower_communication

    from odc_pp.runtime.host_memory import keep_freed_host_memory

    torch.set_num_threads(1)
    keep_freed_host_memory()  # as CPU training does (pretrain_gpt.py): no page-fault storms
    if pp > 1:
        group = dist.group.WORLD
    elif group is None:
        if not dist.is_initialized():
            dist.init_process_group("gloo", init_method=f"file://{tempfile.mktemp()}",
                                    rank=0, world_size=1)
        group = dist.group.WORLD
    config = ModelConfig(vocab_size=512, hidden_size=256, num_layers=4, num_attention_heads=4,
                         max_sequence_length=seq_length)
    chunks = build_chunks(config, pp_rank=dist.get_rank(group) if pp > 1 else 0, pp_size=pp,
                          process_groups=standalone_process_groups())
    q = seq_length // 8
    shapes = [(1, q), (1, 4 * q), (1, 8 * q), (2, 2 * q), (4, q), (1, 6 * q)]
    gen = torch.Generator().manual_seed(0)
    microbatches = [Microbatch(tokens=torch.randint(0, 512, s, generator=gen),
                               labels=torch.randint(0, 512, s, generator=gen)) for s in shapes]
    schedule = lower_communication(generate("zb-h1", pp=pp, num_microbatches=len(shapes)))
    profiler = Profiler(ProfilerConfig(warmup_minibatches=1), schedule=schedule,
                        pp_group=group)
    runtime = PipelineRuntime(RuntimeConfig(), chunks=chunks, pp_group=group)
    for _ in range(4):
        profiler.record(runtime.run_minibatch(schedule, microbatches), microbatches)
    fitted = profiler.sample_cost_model()
    (kinds,) = profiler.local_costs()["stages"].values()  # this rank's one stage
    total = kinds["F"] + kinds["B"] + kinds["W"]
    params = [p for chunk in chunks for p in chunk.parameters()]
    optimizer, steps = torch.optim.AdamW(params, lr=1e-4), []
    for _ in range(6):
        for p in params:
            p.grad = torch.ones_like(p)
        begin = time.perf_counter()
        optimizer.step()
        steps.append(time.perf_counter() - begin)
    return {"a": fitted.a, "b": fitted.b, "c": fitted.c,
            "shares": {k: kinds[k] / total for k in ("F", "B", "W")},
            "optimizer_s": statistics.median(steps[1:]),
            "params": sum(p.numel() for p in params)}


def _reduce_scatter_rank(rank, world_size, numel):
    import time

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    flat, out, times = torch.randn(numel), torch.empty(numel // world_size), []
    for _ in range(12):
        dist.barrier()
        begin = time.perf_counter()
        dist.reduce_scatter_tensor(out, flat, async_op=True).wait()
        times.append(time.perf_counter() - begin)
    return statistics.median(times[2:])


def calibrate_reduce_scatter(params: int, ranks: int = 2) -> float:
    """Seconds of one gloo reduce-scatter of ``params`` fp32 gradients over ``ranks``
    processes (1 thread each): what collective mode pushes after every microbatch. The
    slowest rank's median of 10."""
    from odc_pp.testing.launch import LaunchConfig, run_workers

    numel = params - params % ranks
    return max(run_workers(_reduce_scatter_rank, ranks, numel,
                           config=LaunchConfig(timeout_s=300, threads_per_rank=1)))


def _pipeline_rank(rank, world_size, seq_length):
    return calibrate(seq_length, pp=world_size)


def calibrate_pipeline(seq_length: int = 1024, pp: int = 2) -> dict:
    """Per-stage costs measured in a real pipeline (zb-h1 over ``pp`` ranks, 1 thread
    each): the ranks contend as the measured pipelines do, taking turns idling. ``a`` and
    ``b``: the stages' sums (the whole model); ``c_stage``: the mean per-stage fixed cost
    of a microbatch, which every virtual stage pays; ``optimizer_s``: the ranks' steps
    summed (each steps its own parameters)."""
    from odc_pp.testing.launch import LaunchConfig, run_workers

    fits = run_workers(_pipeline_rank, pp, seq_length,
                       config=LaunchConfig(timeout_s=900, threads_per_rank=1))
    return {"a": sum(f["a"] for f in fits), "b": sum(f["b"] for f in fits),
            "c_stage": statistics.fmean(f["c"] for f in fits),
            "optimizer_s": sum(f["optimizer_s"] for f in fits),
            "shares": {k: statistics.fmean(f["shares"][k] for f in fits)
                       for k in ("F", "B", "W")},
            "per_rank": fits, "pp": pp}


def calibrate_contended(seq_length: int = 1024, ranks: int = 2) -> dict:
    """:func:`calibrate` in ``ranks`` separate processes at once (1 thread each), as the
    measured runs keep every core busy: the ranks contend for caches and memory
    bandwidth, which a lone process does not see. The mean of the processes' fits."""
    import subprocess

    code = ("import json, sys; sys.path.insert(0, %r); "
            "from benchmarks.planner_measure import calibrate; "
            "print(json.dumps(calibrate(%d)))" % (ROOT, seq_length))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    processes = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                  text=True, env=env, cwd=ROOT) for _ in range(ranks)]
    fits = []
    for process in processes:
        out, _ = process.communicate(timeout=900)
        if process.returncode != 0:
            raise RuntimeError(f"calibration process exited with {process.returncode}")
        fits.append(json.loads(out.strip().splitlines()[-1]))
    mean = {key: statistics.fmean(f[key] for f in fits)
            for key in ("a", "b", "c", "optimizer_s")}
    mean["params"] = fits[0]["params"]
    mean["reduce_scatter_s"] = calibrate_reduce_scatter(mean["params"], ranks)
    mean["shares"] = {k: statistics.fmean(f["shares"][k] for f in fits)
                      for k in ("F", "B", "W")}
    mean["processes"] = ranks
    return mean


def predict(flags: list[str], calibration: dict, iterations: range) -> list[float]:
    """Predicted step seconds of each iteration of a 2-rank run of ``flags``."""
    from odc_pp.odc.engine_config import OdcConfig
    from odc_pp.schedule.costs import CostModel
    from odc_pp.schedule.simulator import simulate
    from odc_pp.training.arguments import parse_args
    from odc_pp.schedule.build import build
    from odc_pp.training.schedules import training_request
    from odc_pp.training.data_plan import BatchAssigner, build_source

    from benchmarks.planner_trace import planned_shapes

    job = parse_args(flags).resolve(2)
    args, dp, pp, mode_of_job = job.args, job.layout.dp, job.layout.pp, job.layout.mode
    source, _ = build_source(args)
    planner = BatchAssigner(args, source, dp=dp, pp=pp)
    a, b, shares = calibration["a"], calibration["b"], calibration["shares"]
    stages = pp * args.schedule.num_model_chunks
    row_cost, p2p, once = calibration["c"], CostModel(), 0.0
    if pp > 1 and "pipeline" in calibration:  # measured in a pipeline: per-stage costs
        fit = calibration["pipeline"]
        a, b, shares, row_cost = fit["a"], fit["b"], fit["shares"], fit["c_stage"] * stages
    # each rank steps the optimizer over its share: 1/pp of the model, sharded over dp
    optimizer = calibration.get("optimizer_s", 0.0) / (pp * dp)
    # collective mode reduce-scatters the gradients after every microbatch (gloo's thread
    # shares the busy cores, so the transfer is paid, not hidden)
    push = calibration.get("reduce_scatter_s", 0.0) / pp \
        if mode_of_job.is_collective and dp > 1 else 0.0
    if "training" in calibration:  # fitted on pretrain_gpt.py's own trace (planner_trace)
        mode = "pipeline" if pp > 1 else \
            "collective" if mode_of_job.is_collective else "odc"
        # collective computes as ODC does, and pays its measured reduce-scatter after every
        # microbatch (``push``, gloo's thread on the busy cores) beside its own step time
        fit = calibration["training"]["odc" if mode == "collective" else mode]
        a, b, shares = fit["a"], fit["b"], fit["shares"]
        once = fit.get("c_rank", 0.0)  # not growing with the virtual stages: per rank
        row_cost = fit["c_stage"] * stages + once
        optimizer = calibration["training"][mode]["fixed_s"]  # the step's own time
        push = push if mode == "collective" else 0.0
        p2p = CostModel(t_send_cpu=fit["send_s"], t_recv_cpu=fit["recv_s"])
    out = []
    for iteration in iterations:
        plan = planner.plan(iteration)
        per_microbatch = []  # [replica][microbatch] -> seconds of F + B + W, whole model
        for groups in plan.replicas:
            per_microbatch.append([a * r * s * s + b * r * s + row_cost + push
                                   for r, s in planned_shapes(planner, source, groups)])
        if pp == 1:  # no pipeline: a replica's microbatches run back to back
            out.append(optimizer + _data_parallel_step(
                per_microbatch, in_flight=OdcConfig().max_inflight_pushes
                if mode_of_job.is_collective else None))
            continue
        if mode_of_job.is_collective and dp > 1:  # lock step
            per_microbatch = [[max(c[j] for c in per_microbatch)
                               for j in range(len(per_microbatch[0]))]]
        spans = []
        for costs_of in per_microbatch:
            mean = float(np.mean(costs_of))
            per_stage = [(mean - once) / stages + (once / pp if k < pp else 0.0)
                         for k in range(stages)]  # stages 0..pp-1: one on every rank
            costs = CostModel(t_f=[t * shares["F"] for t in per_stage],
                              t_b=[t * shares["B"] for t in per_stage],
                              t_w=[t * shares["W"] for t in per_stage],
                              t_send_cpu=p2p.t_send_cpu, t_recv_cpu=p2p.t_recv_cpu,
                              microbatch_scale=[c / mean for c in costs_of])
            schedule = build(training_request(args.schedule, pp=pp,
                                              num_microbatches=len(costs_of)), CostModel())
            spans.append(simulate(schedule, costs).makespan)
        out.append(max(spans) + optimizer)
    return out


def _data_parallel_step(costs: list[list[float]], *, in_flight: int | None) -> float:
    """Step seconds of dp replicas without a pipeline. ODC (``in_flight`` None) waits once
    per minibatch: the slowest replica's sum. Collective: each microbatch's gradient
    reduce-scatter is asynchronous, and after issuing its j-th a replica waits for its
    (j - in_flight)-th, which completes once every replica has issued it (the engine's
    ``max_inflight_pushes``; 1 is lock step with one microbatch of slack). A replica with
    fewer microbatches replays empty ones; the step ends when all have finished."""
    if in_flight is None:
        return max(sum(c) for c in costs)
    depth = max(len(c) for c in costs)
    done: list[list[float]] = [[] for _ in costs]
    for j in range(depth):
        released = max(d[j - in_flight] for d in done) if j >= in_flight else 0.0
        for r, c in enumerate(costs):
            previous = done[r][-1] if j else 0.0
            done[r].append(max(previous + (c[j] if j < len(c) else 0.0), released))
    return max(d[-1] for d in done)


def _run(flags: list[str], iters: int) -> list[float]:
    """Step seconds of every iteration of a 2-rank pretrain_gpt.py run (1 thread each)."""
    with tempfile.TemporaryDirectory() as tmp:
        run = launch(flags + ["--train-iters", str(iters)], nproc=2, tmp_path=Path(tmp),
                     name="planner_measure", timeout=1800, launcher="torchrun")
        if run.returncode != 0:
            raise RuntimeError(run.describe())
        return [r["step_s"] for r in run.records()]


CALIBRATION_MODEL = MODEL + LENGTHS["seq1024"]
"""The model and lengths of the traced calibration runs (their seed is their own)."""
CALIBRATION_ITERS = 6


def calibrate_all(*, training: bool = True) -> dict:
    """Every calibration the validation uses: the runtime's on hand-made microbatches
    (:func:`calibrate_contended`, :func:`calibrate_pipeline`) and (``training``), which
    :func:`predict` prefers, pretrain_gpt.py's own trace per mode
    (:func:`benchmarks.planner_trace.calibrate_from_training`)."""
    from benchmarks.planner_trace import calibrate_from_training

    calibration = calibrate_contended()
    calibration["pipeline"] = calibrate_pipeline()
    if training:
        calibration["training"] = calibrate_from_training(CALIBRATION_MODEL,
                                                          iters=CALIBRATION_ITERS)
    return calibration


def measure_section(*, rounds: int = 5, iters: int = 4,
                    cost_file: str | None = None) -> dict:
    """Calibrate, then run every configuration ``rounds`` times, rotating. The traced
    calibration runs (:mod:`benchmarks.planner_trace`) rotate with them, one per mode and
    round, and are fitted pooled: machine drift over the ~20 minutes hits both alike."""
    from benchmarks.planner_trace import (CALIBRATION_RUNS, calibration_flags,
                                          fit_calibration, traced_run)

    calibration = calibrate_all(training=False)
    if cost_file:  # the --sample-cost-model file every load-balance mode can use
        with open(cost_file, "w", encoding="utf-8") as handle:
            json.dump({"a": calibration["a"], "b": calibration["b"],
                       "c": calibration["c"]}, handle)
    load_before = os.getloadavg()
    runs: dict[str, list[list[float]]] = {}
    loads: dict[str, list[float]] = {}
    configs = _configs()
    traces: dict[str, list[dict]] = {mode: [] for mode in CALIBRATION_RUNS}
    jobs = list(configs) + [f"calibrate:{mode}" for mode in CALIBRATION_RUNS]
    for round_index in range(rounds):  # configurations alternate round by round
        for name in rotated(jobs, round_index):
            if name.startswith("calibrate:"):
                mode = name.split(":", 1)[1]
                traces[mode].append(traced_run(calibration_flags(CALIBRATION_MODEL, mode),
                                               CALIBRATION_ITERS))
                continue
            loads.setdefault(name, []).append(load_1min())
            runs.setdefault(name, []).append(_run(configs[name], iters)[1:])
            print(f"round {round_index} {name}: {runs[name][-1]}", file=sys.stderr,
                  flush=True)
    calibration["training"] = fit_calibration(CALIBRATION_MODEL, traces, CALIBRATION_ITERS)
    rows = []
    for name in configs:
        measured = [statistics.median(step[i] for step in runs[name])
                    for i in range(iters - 1)]
        rows.append({"config": name, "measured_median_s": statistics.median(measured),
                     "measured_per_iteration_s": measured, "measured_runs_s": runs[name],
                     "measured_min_max_s": [min(min(r) for r in runs[name]),
                                            max(max(r) for r in runs[name])],
                     "load_1min": loads[name]})
    section = {"calibration": calibration, "rows": rows, "rounds": rounds,
               "iterations": iters, "loadavg_before": load_before,
               "loadavg_after": os.getloadavg()}
    return predict_section(section)


def _configs() -> dict[str, list[str]]:
    return {f"{c}/{l}": MODEL + cf + lf for c, cf in CONFIGS.items()
            for l, lf in LENGTHS.items() if f"{c}/{l}" in MEASURED}


def predict_section(section: dict) -> dict:
    """``section`` (calibration and measured rows) with every row's prediction and error
    from the current model: deterministic, so measured rows can be re-predicted without
    re-running them (``bench_planner_validation.py --repredict``)."""
    configs, errors = _configs(), []
    iters = section.get("iterations", 4)
    for row in section["rows"]:
        predicted = predict(configs[row["config"]], section["calibration"], range(1, iters))
        measured = row["measured_per_iteration_s"]
        # the mean step over the same iterations (throughput), iteration for iteration
        error = 100 * (statistics.fmean(predicted) - statistics.fmean(measured)) / \
            statistics.fmean(measured)
        row.update(predicted_s=statistics.fmean(predicted),
                   measured_mean_s=statistics.fmean(measured),
                   predicted_per_iteration_s=predicted, error_pct=round(error, 2))
        errors.append(abs(error))
    section.update(median_abs_error_pct=statistics.median(errors),
                   worst_abs_error_pct=max(errors), ranking=ranking(section["rows"]))
    return section


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""
    def ranks(values):
        order = sorted(range(len(values)), key=values.__getitem__)
        out = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out
    rx, ry = ranks(x), ranks(y)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    var = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return cov / var if var else 1.0


def ranking(rows: list[dict]) -> dict:
    """Per length distribution (the same job, alternative configurations): Spearman's
    correlation of predicted and measured mean steps, the measured and predicted best,
    and how much slower the predicted best measured than the measured best (issue 31's
    bars: >= 0.9, within 3%)."""
    out = {}
    for lengths in LENGTHS:
        group = [r for r in rows if r["config"].endswith("/" + lengths)]
        if len(group) < 2:
            continue
        measured_best = min(group, key=lambda r: r["measured_mean_s"])
        predicted_best = min(group, key=lambda r: r["predicted_s"])
        out[lengths] = {
            "configs": len(group),
            "spearman": round(spearman([r["predicted_s"] for r in group],
                                       [r["measured_mean_s"] for r in group]), 3),
            "measured_best": measured_best["config"],
            "predicted_best": predicted_best["config"],
            "predicted_best_over_measured_best": round(
                predicted_best["measured_mean_s"] / measured_best["measured_mean_s"], 4)}
    return out
