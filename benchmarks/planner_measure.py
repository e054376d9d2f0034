"""Item 6b of issue 22: the planner's pipeline model against measured two-rank runs on
this machine (``bench_planner_validation.py --measure``). Quiet machine only: 2 ranks, 1
thread each, a compute-dominated shape; nothing here has been run for a claim yet.

1. Calibrate once per machine, from the profiler: one process runs the model (pp = 1,
   zb-h1 so B and W are timed apart) on microbatches of several shapes;
   :meth:`Profiler.sample_cost_model` fits seconds per token and per token^2 of a whole
   microbatch (F + B + W), and the profiler's per-kind means give the F : B : W split.
2. For each configuration (pp/dp, schedule, dp mode, load balance, length distribution),
   the prediction uses the exact plans pretrain_gpt.py makes (``DataPlanner``) and the
   schedule it builds (``build_schedule``), simulated with the calibrated costs per
   replica (ODC: the slowest replica; collective: lock step).
3. Rounds alternate the configurations; each runs pretrain_gpt.py on 2 ranks with
   ``OMP_NUM_THREADS=1``; the first iteration is a warm-up. Reported per configuration:
   median predicted and measured step time, min-max, error; overall median and worst
   error, and the load average before and after.

Not modelled (the known weak points): the optimizer step and the loss all-reduce,
pipeline transfer time (gloo, t_comm = 0), the embedding and output layer (layers split
evenly over stages), and variation of microbatch costs inside a replica (mean costs).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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


def calibrate(seq_length: int = 1024) -> dict:
    """(a, b, shares) from the profiler on one process (pp = 1)."""
    import torch
    import torch.distributed as dist

    from odc_pp.data import Microbatch
    from odc_pp.megatron.compat import singleton_process_groups
    from odc_pp.megatron.model import ModelConfig, build_chunks
    from odc_pp.runtime import PipelineRuntime, Profiler, ProfilerConfig, RuntimeConfig
    from odc_pp.schedule.generators import generate
    from odc_pp.schedule.lowering import lower_communication

    torch.set_num_threads(1)
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"file://{tempfile.mktemp()}",
                                rank=0, world_size=1)
    config = ModelConfig(vocab_size=512, hidden_size=256, num_layers=4, num_attention_heads=4,
                         max_sequence_length=seq_length)
    chunks = build_chunks(config, pp_rank=0, pp_size=1, process_groups=singleton_process_groups())
    q = seq_length // 8
    shapes = [(1, q), (1, 4 * q), (1, 8 * q), (2, 2 * q), (4, q), (1, 6 * q)]
    gen = torch.Generator().manual_seed(0)
    microbatches = [Microbatch(tokens=torch.randint(0, 512, s, generator=gen),
                               labels=torch.randint(0, 512, s, generator=gen)) for s in shapes]
    schedule = lower_communication(generate("zb-h1", pp=1, num_microbatches=len(shapes)))
    profiler = Profiler(ProfilerConfig(warmup_minibatches=1), schedule=schedule,
                        pp_group=dist.group.WORLD)
    runtime = PipelineRuntime(RuntimeConfig(), chunks=chunks, pp_group=dist.group.WORLD)
    for _ in range(4):
        profiler.record(runtime.run_minibatch(schedule, microbatches), microbatches)
    fitted = profiler.sample_cost_model()
    kinds = profiler.local_costs()["stages"][0]
    total = kinds["F"] + kinds["B"] + kinds["W"]
    return {"a": fitted.a, "b": fitted.b, "c": fitted.c,
            "shares": {k: kinds[k] / total for k in ("F", "B", "W")}}


def predict(flags: list[str], calibration: dict, iterations: range) -> list[float]:
    """Predicted step seconds of each iteration of a 2-rank run of ``flags``."""
    from odc_pp.schedule.costs import CostModel
    from odc_pp.schedule.simulator import simulate
    from odc_pp.training.arguments import parse_args
    from odc_pp.training.components import build_schedule
    from odc_pp.training.data_plan import DataPlanner, build_source

    args = parse_args(flags)
    dp = args.data_parallel_size(2)
    pp = args.parallel.pipeline_model_parallel_size
    source, _ = build_source(args)
    planner = DataPlanner(args, source, dp=dp, pp=pp)
    a, b, shares = calibration["a"], calibration["b"], calibration["shares"]
    stages = pp * args.schedule.num_model_chunks
    out = []
    for iteration in iterations:
        plan = planner.plan(iteration)
        replicas = []
        for groups in plan.replicas:
            shapes = [(1, sum(source.length(i) for i in g)) if planner.packed
                      else (len(g), max(source.length(i) for i in g)) for g in groups]
            total = float(np.mean([a * r * s * s + b * r * s + calibration["c"]
                                   for r, s in shapes])) / stages
            replicas.append((len(groups), total))
        if args.parallel.dp_mode == "collective" and dp > 1:
            replicas = [(replicas[0][0], max(t for _, t in replicas))]
        spans = []
        for count, total in replicas:
            costs = CostModel(t_f=total * shares["F"], t_b=total * shares["B"],
                              t_w=total * shares["W"])
            schedule = build_schedule(args.schedule, pp=pp, num_microbatches=count,
                                      costs=CostModel())
            spans.append(simulate(schedule, costs).makespan)
        out.append(max(spans))
    return out


def _run(flags: list[str], iters: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "log.jsonl")
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT, PYTHONWARNINGS="ignore")
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "2", os.path.join(ROOT, "pretrain_gpt.py"), *flags,
                        "--train-iters", str(iters), "--log-json", log], cwd=ROOT, env=env,
                       check=True, capture_output=True, timeout=1800)
        with open(log) as handle:
            return [json.loads(line)["step_s"] for line in handle if line.strip()]


def measure_section(*, rounds: int = 3, iters: int = 4,
                    cost_file: str | None = None) -> dict:
    calibration = calibrate()
    if cost_file:  # the --sample-cost-model file every load-balance mode can use
        with open(cost_file, "w", encoding="utf-8") as handle:
            json.dump({"a": calibration["a"], "b": calibration["b"],
                       "c": calibration["c"]}, handle)
    load_before = os.getloadavg()
    runs: dict[str, list[list[float]]] = {}
    configs = {f"{c}/{l}": MODEL + cf + lf for c, cf in CONFIGS.items()
               for l, lf in LENGTHS.items()}
    for _ in range(rounds):  # configurations alternate round by round
        for name, flags in configs.items():
            runs.setdefault(name, []).append(_run(flags, iters)[1:])
    rows, errors = [], []
    for name, flags in configs.items():
        predicted = predict(flags, calibration, range(1, iters))
        measured = [statistics.median(step[i] for step in runs[name])
                    for i in range(iters - 1)]
        error = 100 * (statistics.median(predicted) - statistics.median(measured)) / \
            statistics.median(measured)
        errors.append(abs(error))
        rows.append({"config": name, "predicted_s": statistics.median(predicted),
                     "measured_median_s": statistics.median(measured),
                     "measured_min_max_s": [min(min(r) for r in runs[name]),
                                            max(max(r) for r in runs[name])],
                     "error_pct": round(error, 2)})
    return {"calibration": calibration, "rows": rows, "rounds": rounds,
            "median_abs_error_pct": statistics.median(errors),
            "worst_abs_error_pct": max(errors),
            "loadavg_before": load_before, "loadavg_after": os.getloadavg()}
