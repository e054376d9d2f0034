"""Pipeline runtime benchmark (pp ranks, gloo, this machine's CPU).

For every schedule family: the measured step time (forward + backward of one minibatch,
max over ranks, median of ``--repeats``), the simulator's makespan for the same lowered
schedule from costs profiled on those same timed steps (mean T_F/T_B/T_W per stage and
OFFLOAD/RELOAD time from the action timings, T_comm from a ping-pong), and runtime
efficiency = predicted / measured. ZB-auto is also re-planned from the costs profiled on
zb-h1's warm-up steps ("zb-auto-replanned"). All configurations are timed in rounds
(one step of each per round, the order rotating between rounds) so load from other
processes hits them alike; the 1-minute load average before each round is recorded and
each row reports the median step with min-max over the rounds. Defaults follow the timing
rules of this machine: 2 ranks with 1 thread each, a compute-dominated shape (hidden 256,
sequences of 1024).

In the same run, torch.distributed.pipelining's ScheduleZBVZeroBubble and
ScheduleInterleavedZeroBubble train the *same megatron-core chunks* (wrapped as
PipelineStages; their linears switched to native autograd, which torch's own
input/weight split needs) on the same microbatches. Every microbatch has the same
sequence length here because torch.distributed.pipelining requires static shapes.

Each row also has the CPU seconds of a step (``cpu_s``: user + system, both ranks) and
its minor page faults per round; ``--pool FILE...`` pools the round-by-round ratios of
several runs per sequence length (result files, or a benchmark's file of
``benchmarks/results/history/``: its runs marked pooled). ``bench_runtime_isolated.py`` runs each runtime in its
own processes instead (its own heap, as in training).

    .venv/bin/python benchmarks/bench_runtime.py --json
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from odc_pp.testing.bench import emit, load_1min, rotated, spread  # noqa: E402
from odc_pp.testing.launch import LaunchConfig, run_workers  # noqa: E402

OURS = ["1f1b", "interleaved", "zb-h1", "zb-h2", "zb-auto", "zbv", "v-half", "v-min",
        "offload", "dualpipev"]
"""Our rows by default; ``NAME+fill`` (any but offload) adds NAME re-planned from the
measured costs with its gaps filled (``replanned``)."""


def add_shape_arguments(parser, *, repeats: int = 3) -> None:
    """The pipeline, model and data shape of a runtime benchmark, and its rounds."""
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=repeats, help="timed rounds (>= 3)")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_shape_arguments(parser)
    parser.add_argument("--schedules", default=",".join(OURS))
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--release-host-memory", action="store_true",
                        help="leave glibc returning freed memory to the OS (the default "
                             "before odc_pp.runtime.host_memory; page faults in every step)")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results",
                                                      "runtime_cpu.json"))
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--native-linears", default="",
                        help="comma-separated schedules also run with the linears' native "
                             "autograd (weight gradients in B, no deferral; W actions find "
                             "nothing to do): rows '<name>+native-linears' isolate the cost "
                             "of the deferrable linears")
    parser.add_argument("--bare", action="store_true",
                        help="also time each local chunk's forward and full backward on "
                             "microbatch 0 outside the runtime (median of 5): with the "
                             "profiled action costs, the runtime's overhead per action")
    parser.add_argument("--pool", nargs="+", metavar="JSON",
                        help="measure nothing: pool the round-by-round ratios of these "
                             "results (same code, several runs; a history file gives its "
                             "runs marked pooled) per sequence length, with "
                             "a bootstrap 95%% interval of the median")
    parser.add_argument("--profile", action="store_true",
                        help="after the timed rounds, one more step of every configuration "
                             "under torch.profiler: per rank, the ops' self CPU time, the "
                             "top ops, and the time outside ops per microbatch")
    return parser.parse_args(argv)


# ----- worker -------------------------------------------------------------------------
def make_data(args):
    from odc_pp.data import Microbatch

    generator = torch.Generator().manual_seed(0)
    shape = (args.batch, args.seq)
    return [Microbatch(tokens=torch.randint(0, 128, shape, generator=generator),
                       labels=torch.randint(0, 128, shape, generator=generator))
            for _ in range(args.microbatches)]


class GcClock:
    """Seconds and passes of Python's garbage collector (``gc.callbacks``) since the last
    :meth:`take`: a pause of the cyclic collector lands on whichever step trips it."""

    def __init__(self):
        self.seconds, self.passes, self._began = 0.0, 0, None
        gc.callbacks.append(self._callback)

    def _callback(self, phase, info):
        if phase == "start":
            self._began = time.perf_counter()
        elif self._began is not None:
            self.seconds += time.perf_counter() - self._began
            self.passes += 1
            self._began = None

    def take(self) -> tuple[float, int]:
        out = (self.seconds, self.passes)
        self.seconds, self.passes = 0.0, 0
        return out


GC_CLOCK = GcClock()


class Runner:
    """One benchmarked configuration: ``run()`` does one minibatch on this rank."""

    def __init__(self, row, run, chunks, *, native_autograd, profiler=None, schedule=None,
                 group=None):
        self.row, self.run, self.chunks = row, run, chunks
        self.group = group
        """The ranks that run this configuration (None: the world)."""
        self.native_autograd = native_autograd
        self.profiler, self.schedule = profiler, schedule
        self.times, self.page_faults, self.gc_seconds = [], [], []
        self.cpu_seconds = []
        """Per step, the CPU seconds (user + system, every thread) of all ranks summed:
        the work a runtime does, whatever the waits and the machine's other load."""

    def predict(self):
        """Simulated makespan from the costs profiled on the timed steps (collective)."""
        from odc_pp.schedule.simulator import simulate

        costs = self.profiler.cost_model()
        self.row["predicted_s"] = simulate(self.schedule, costs).makespan
        self.row["costs"] = costs.to_dict()

    def run_once(self):
        """One minibatch with this runner's linear mode (the chunks may be shared)."""
        for module in (m for chunk in self.chunks for m in chunk.modules()):
            if hasattr(module, "native_autograd"):
                module.native_autograd = self.native_autograd
        return self.run()

    def time_one_step(self):
        """Record the slowest rank's wall time of one minibatch."""
        dist.barrier(group=self.group)
        before = resource.getrusage(resource.RUSAGE_SELF)
        GC_CLOCK.take()
        start = time.perf_counter()
        result = self.run_once()
        elapsed = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_SELF)
        # [step seconds, minor page faults, seconds in the garbage collector]: the max rank
        measured = torch.tensor([elapsed, after.ru_minflt - before.ru_minflt,
                                 GC_CLOCK.take()[0]], dtype=torch.float64)
        cpu = torch.tensor([after.ru_utime + after.ru_stime - before.ru_utime
                            - before.ru_stime], dtype=torch.float64)
        if self.profiler is not None:
            self.profiler.record(result)
        dist.all_reduce(measured, op=dist.ReduceOp.MAX, group=self.group)
        dist.all_reduce(cpu, group=self.group)
        self.times.append(float(measured[0]))
        self.page_faults.append(int(measured[1]))
        self.gc_seconds.append(float(measured[2]))
        self.cpu_seconds.append(float(cpu[0]))


class LayoutCache:
    """The chunks of each (chunk count, placement) on this rank of ``pp_group`` (None: the
    world), built once and shared by every configuration of that layout."""

    def __init__(self, args, groups, pp_group=None, channels=None):
        self.args, self.groups, self.chunks = args, groups, {}
        self.pp_group = pp_group if pp_group is not None else dist.group.WORLD
        self.channels = channels
        """Our runtime's point-to-point groups (None: made from ``pp_group``)."""

    def get(self, num_chunks, placement):
        from odc_pp.megatron.model import ModelConfig, build_chunks
        from odc_pp.schedule.ir import Placement

        key = (num_chunks, Placement(placement).value)
        if key not in self.chunks:
            config = ModelConfig(vocab_size=128, hidden_size=self.args.hidden,
                                 num_layers=self.args.layers, num_attention_heads=4,
                                 max_sequence_length=self.args.seq)
            self.chunks[key] = build_chunks(config, pp_rank=dist.get_rank(self.pp_group),
                                            pp_size=self.args.pp, num_chunks=num_chunks,
                                            placement=placement, process_groups=self.groups)
        return self.chunks[key]


def bench_ours(name, schedule, cache, microbatches, args):
    """A Runner for our runtime; its profiler records every timed step, and a planning
    cost model is profiled from two warm-up steps (used to re-plan ZB-auto)."""
    from odc_pp.runtime import PipelineRuntime, Profiler, ProfilerConfig, RuntimeConfig

    chunks = cache.get(schedule.num_chunks, schedule.placement)
    group = cache.pp_group
    runtime = PipelineRuntime(RuntimeConfig(), chunks=chunks, pp_group=group,
                              channels=cache.channels)
    warmup = Profiler(ProfilerConfig(warmup_minibatches=1), schedule=schedule,
                      pp_group=group)

    def run():
        for chunk in chunks:
            chunk.zero_grad(set_to_none=True)
        return runtime.run_minibatch(schedule, microbatches)

    for _ in range(3):
        warmup.record(run())
    sample = torch.zeros(args.seq, args.batch, args.hidden)
    t_comm = warmup.measure_comm(sample)
    profiler = Profiler(ProfilerConfig(warmup_minibatches=0), schedule=schedule,
                        pp_group=group)
    profiler.t_comm = t_comm
    runner = Runner({"schedule": name}, run, chunks, native_autograd=False,
                    profiler=profiler, schedule=schedule, group=group)
    return runner, warmup.cost_model()


def measured_memory_costs(schedule, warm_costs, cache, microbatches):
    """``warm_costs`` with the memory deltas measured on one minibatch of ``schedule`` with
    activation tracking (the share of a microbatch's activations its W holds); the times
    stay the untracked warm-up's (tracking slows the actions). Collective."""
    import dataclasses

    from odc_pp.runtime import PipelineRuntime, Profiler, ProfilerConfig, RuntimeConfig

    chunks = cache.get(schedule.num_chunks, schedule.placement)
    tracked = PipelineRuntime(RuntimeConfig(track_activations=True), chunks=chunks,
                              pp_group=cache.pp_group, channels=cache.channels)
    profiler = Profiler(ProfilerConfig(warmup_minibatches=0), schedule=schedule,
                        pp_group=cache.pp_group)
    for chunk in chunks:
        chunk.zero_grad(set_to_none=True)
    profiler.record(tracked.run_minibatch(schedule, microbatches))
    profiler.t_comm = warm_costs.t_comm
    memory = profiler.cost_model()
    return dataclasses.replace(warm_costs, mem_f=memory.mem_f, mem_b=memory.mem_b,
                               mem_w=memory.mem_w)


def bench_filled(name, cache, microbatches, args):
    """The Runner of ``name`` = ``base+fill``: ``base`` re-planned from profiled costs as
    ``--fill-pipeline-gaps`` does in training, with one difference: here the memory
    deltas are measured (one minibatch with activation tracking), while training, which
    does not track activations here, assumes W holds all of a microbatch's activations -- safe, but it fills less (interleaved at seq 2048: 1.6% shorter in
    simulation instead of 3%). The uniform-cost plan (BW split) runs the
    warm-up; from its measured per-stage times and memory deltas (``measured_memory_costs``)
    ``base`` is generated again with its gaps filled (``generate(..., fill_gaps=)``: within
    the family's memory cap, a fixed pattern's own peak). Every rank gets the same gathered
    costs, so the same plan. ``args.memory_limit`` (if any) is the re-plan's
    ``--memory-limit`` (microbatch-chunk units under the measured deltas). The row records
    the costs, the limit, the simulated steps and activation peaks."""
    from odc_pp.schedule.costs import CostModel
    from odc_pp.schedule.generators import generate
    from odc_pp.schedule.generators.gaps import DEFAULT_FILL_EVALUATIONS, split_fused
    from odc_pp.schedule.lowering import lower
    from odc_pp.schedule.simulator import simulate

    base = name.partition("+")[0]
    unit = CostModel(offload_bandwidth=1.0)
    plan = generate(base, pp=args.pp, num_microbatches=args.microbatches, costs=unit)
    uniform = lower(plan, unit)
    # profiled with every BW as B then W (the same arithmetic), so that B and W are
    # measured apart rather than each taken as half of BW
    split = lower(plan.copy(ranks=split_fused(plan)), unit)
    warm_costs = bench_ours(base, split, cache, microbatches, args)[1]
    costs = measured_memory_costs(split, warm_costs, cache, microbatches)
    limit = getattr(args, "memory_limit", None)
    schedule = lower(generate(base, pp=args.pp, num_microbatches=args.microbatches,
                              costs=costs, memory_limit=limit,
                              fill_gaps=DEFAULT_FILL_EVALUATIONS), costs)
    runner = bench_ours(name, schedule, cache, microbatches, args)[0]
    runner.row.update(plan_costs=costs.to_dict(), gap_fill=schedule.meta["gap_fill"],
                      memory_limit=schedule.meta.get("memory_limit"),
                      peak_activation_units=simulate(schedule, costs).peak_activation,
                      simulated_s={"uniform_plan": simulate(uniform, costs).makespan,
                                   "filled_plan": simulate(schedule, costs).makespan})
    return runner


class _TorchStageModule(torch.nn.Module):
    """A GPTChunk as torch.distributed.pipelining expects: tensors in, tensor out."""

    def __init__(self, chunk):
        super().__init__()
        self.chunk = chunk

    def forward(self, x):
        from odc_pp.megatron.compat import causal_mask

        model = self.chunk.model
        if self.chunk.is_first:
            seq = x.shape[1]
            positions = torch.arange(seq).unsqueeze(0).expand_as(x)
            return model(x, positions, causal_mask(seq, x.device))
        model.set_input_tensor(x)
        return model(None, None, causal_mask(x.shape[0], x.device))


def bench_torch(name, cache, microbatches, args):
    from torch.distributed.pipelining import (PipelineStage, ScheduleInterleavedZeroBubble,
                                              ScheduleZBVZeroBubble)

    placement = "v" if name == "torch-ZBVZeroBubble" else "interleaved"
    chunks = cache.get(2, placement)
    for module in (m for chunk in chunks for m in chunk.modules()):
        if hasattr(module, "native_autograd"):
            module.native_autograd = True  # restored per step by Runner
    num_stages = 2 * args.pp
    # runtime shape inference: with static input_args/output_args, torch 2.13's
    # zero-bubble schedules leave weight gradients unset (checked in check_torch_grads)
    stages = [PipelineStage(_TorchStageModule(chunk), chunk.stage, num_stages,
                            torch.device("cpu"), group=cache.pp_group) for chunk in chunks]

    def loss_fn(logits, target):
        return torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                                 target.reshape(-1))

    schedule_class = (ScheduleZBVZeroBubble if name == "torch-ZBVZeroBubble"
                      else ScheduleInterleavedZeroBubble)
    schedule = schedule_class(stages, args.microbatches, loss_fn=loss_fn)
    tokens = torch.cat([mb.tokens for mb in microbatches])
    labels = torch.cat([mb.labels for mb in microbatches])
    has_first = any(chunk.is_first for chunk in chunks)
    has_last = any(chunk.is_last for chunk in chunks)

    def run():
        for chunk in chunks:
            chunk.zero_grad(set_to_none=True)
        inputs = (tokens,) if has_first else ()
        schedule.step(*inputs, target=labels if has_last else None)

    run()  # warmup
    return Runner({"schedule": name}, run, chunks, native_autograd=True,
                  group=cache.pp_group)


def bare_compute(runner, microbatch, reps: int = 5) -> dict:
    """Per local chunk: its forward and its full backward (input and weight gradients) on
    ``microbatch`` outside the runtime, median seconds of ``reps``, beside the action
    costs the runtime's profiler measured for that stage (F, and B + W); every rank's."""
    costs = runner.profiler.cost_model()
    mine = {}
    for chunk in runner.chunks:
        forward, backward = [], []
        for _ in range(reps):
            hidden = None
            if not chunk.is_first:
                shape, dtype = chunk.input_shape(microbatch)
                hidden = torch.randn(shape, dtype=dtype, requires_grad=True)
            start = time.perf_counter()
            out = chunk(hidden, microbatch)
            middle = time.perf_counter()
            torch.autograd.backward(out, torch.ones_like(out))
            forward.append(middle - start)
            backward.append(time.perf_counter() - middle)
        chunk.zero_grad(set_to_none=True)
        def of(values, stage=chunk.stage):
            return values[stage] if isinstance(values, list) else values

        mine[chunk.stage] = {"bare_f_s": statistics.median(forward),
                             "bare_bw_s": statistics.median(backward),
                             "runtime_f_s": of(costs.t_f),
                             "runtime_b_plus_w_s": of(costs.t_b) + of(costs.t_w)}
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return {str(stage): value for ranks in gathered for stage, value in ranks.items()}


def profile_one_step(runner, microbatches: int, top: int = 15) -> dict:
    """One step under torch.profiler (CPU): wall, the summed self time of the top-level
    ops (aten, and gloo's collectives as torch records them), the rest per microbatch
    (Python: the runtime, autograd's engine, the schedule's interpreter), the top ops by
    self time; every rank's, gathered."""
    from torch.profiler import ProfilerActivity, profile

    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        runner.run_once()
        wall = time.perf_counter() - start
    events = prof.key_averages()
    ops = sorted(((e.key, e.self_cpu_time_total / 1e6, e.count) for e in events),
                 key=lambda item: -item[1])
    in_ops = sum(seconds for _, seconds, _ in ops)
    mine = {"wall_s": wall, "ops_self_s": in_ops,
            "outside_ops_per_microbatch_ms": 1e3 * (wall - in_ops) / microbatches,
            "top_ops": [{"op": k, "self_s": round(t, 5), "calls": c} for k, t, c in ops[:top]]}
    actions: dict[str, float] = {}  # torch.distributed.pipelining's PP:<stage><kind><mb>
    for event in events:
        match = re.fullmatch(r"PP:\d+([A-Z]+)\d+", event.key)
        if match:
            actions[match.group(1)] = actions.get(match.group(1), 0.0) \
                + event.cpu_time_total / 1e6
    if actions:
        mine["pipelining_actions_s"] = actions
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return {"ranks": gathered}


def check_same_gradients(runners):
    """Record, in each torch row, how far its gradients are from ours on the same chunks
    (proves both compute the same minibatch; the losses use the same normalisation
    because every microbatch has the same token count)."""
    by_name = {runner.row["schedule"]: runner for runner in runners}
    for theirs_name, ours_name in (("torch-ZBVZeroBubble", "zbv"),
                                   ("torch-InterleavedZeroBubble", "interleaved"),
                                   ("torch-ZBVZeroBubble", "zbv+fill"),
                                   ("torch-InterleavedZeroBubble", "interleaved+fill")):
        if theirs_name not in by_name or ours_name not in by_name:
            continue
        ours, theirs = by_name[ours_name], by_name[theirs_name]
        ours.run_once()
        expected = [p.grad.clone() for chunk in ours.chunks for p in chunk.parameters()]
        theirs.run_once()
        worst = 0.0
        for param, grad in zip((p for chunk in theirs.chunks for p in chunk.parameters()),
                               expected):
            actual = param.grad if param.grad is not None else torch.zeros_like(grad)
            worst = max(worst, float((actual - grad).abs().max()
                                     / grad.abs().max().clamp_min(1e-12)))
        worst_tensor = torch.tensor([worst], dtype=torch.float64)
        dist.all_reduce(worst_tensor, op=dist.ReduceOp.MAX)
        theirs.row["grad_max_rel_diff_vs_" + ours_name] = float(worst_tensor)


def worker(rank, world_size, args):
    from odc_pp.runtime.host_memory import keep_freed_host_memory

    torch.set_num_threads(args.threads)
    if not args.release_host_memory:  # every configuration of the process alike
        keep_freed_host_memory()
    rows = run_benchmark(args)
    return rows if rank == 0 else None


def build_runners(args, cache, microbatches) -> list:
    """Every requested configuration's Runner: ours (``NAME+fill`` re-planned, ``NAME`` at
    uniform costs, with ``--native-linears`` twins), ZB-auto re-planned from ZB-H1's
    profile, and PyTorch's rows that a summary compares."""
    from odc_pp.schedule.costs import CostModel
    from odc_pp.schedule.generators import generate
    from odc_pp.schedule.lowering import lower

    runners, zb_h1_costs = [], None
    for name in args.schedules.split(","):
        if name.endswith("+fill"):
            runners.append(bench_filled(name, cache, microbatches, args))
            continue
        plan_costs = CostModel(offload_bandwidth=1.0)
        schedule = lower(generate(name, pp=args.pp, num_microbatches=args.microbatches,
                                  costs=plan_costs), plan_costs)
        runner, costs = bench_ours(name, schedule, cache, microbatches, args)
        runners.append(runner)
        if name in args.native_linears.split(","):
            native = bench_ours(name, schedule, cache, microbatches, args)[0]
            native.native_autograd = True
            native.row["schedule"] = f"{name}+native-linears"
            runners.append(native)
        if name == "zb-h1":
            zb_h1_costs = costs
    if zb_h1_costs is not None:
        replanned = lower(generate("zb-auto", pp=args.pp, num_microbatches=args.microbatches,
                                   costs=zb_h1_costs), zb_h1_costs)
        runners.append(bench_ours("zb-auto-replanned", replanned, cache, microbatches,
                                  args)[0])
    requested = set(args.schedules.split(","))
    for name, counterparts in (("torch-ZBVZeroBubble", {"zbv", "zbv+fill"}),
                               ("torch-InterleavedZeroBubble",
                                {"interleaved", "zb-h1", "interleaved+fill"})):
        if requested & counterparts:  # only the rows a summary compares
            runners.append(bench_torch(name, cache, microbatches, args))
    return runners


def run_benchmark(args):
    from odc_pp.training.distributed import standalone_process_groups

    cache = LayoutCache(args, standalone_process_groups())
    microbatches = make_data(args)
    runners = build_runners(args, cache, microbatches)
    # one untimed round of every configuration after all were built: the heap grows to
    # what the largest needs and the warm-ups' order leaves no configuration first alone
    for runner in runners:
        runner.run_once()
    # rounds over every configuration, so load from other processes hits all alike
    loads = []
    for round_index in range(args.repeats):
        loads.append(load_1min())
        for runner in rotated(runners, round_index):
            runner.time_one_step()
    for runner in runners:
        if runner.profiler is not None:
            runner.predict()
    if args.profile:
        for runner in runners:
            runner.row["profile"] = profile_one_step(runner, args.microbatches)
    if args.bare:
        for runner in runners:
            if runner.profiler is not None:
                runner.row["bare"] = bare_compute(runner, microbatches[0])
    check_same_gradients(runners)
    rows = []
    for runner in runners:
        row = dict(runner.row, measured_s=statistics.median(runner.times),
                   step_times_s=runner.times, measured_spread=spread(runner.times),
                   load_1min=loads,
                   # minor page faults of a step (the rank with most): fresh host pages
                   page_faults=statistics.median(runner.page_faults),
                   page_faults_rounds=runner.page_faults,
                   # seconds of Python's cyclic garbage collector inside a step (the rank
                   # with most)
                   gc_s=spread(runner.gc_seconds),
                   # CPU seconds of a step, all ranks summed (user + system)
                   cpu_s=spread(runner.cpu_seconds))
        if "predicted_s" in row:
            row["efficiency"] = row["predicted_s"] / row["measured_s"]
        rows.append(row)
    return rows


# ----- pooling runs ---------------------------------------------------------------------
PAIRS = (("zbv", "torch-ZBVZeroBubble"), ("interleaved", "torch-InterleavedZeroBubble"),
         ("zbv+fill", "torch-ZBVZeroBubble"),
         ("interleaved+fill", "torch-InterleavedZeroBubble"))


def _bootstrap_median(values: list[float], reps: int = 4000, seed: int = 0) -> list[float]:
    """The 2.5th and 97.5th percentiles of the median of ``values`` resampled (seeded)."""
    import random

    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values)))
                     for _ in range(reps))
    return [round(medians[int(0.025 * reps)], 4), round(medians[int(0.975 * reps)], 4)]


def pool(paths: list[str]) -> dict:
    """Per sequence length and pair: every round's ratio (their step / ours, and their
    CPU seconds / ours where recorded) over all runs of ``paths`` (result files, or
    history files: their runs marked pooled), its median, bootstrap interval, the share
    of rounds at >= 1.0, and each run's own median."""
    from benchmarks.results_history import runs

    pooled: dict = {}
    named = runs(paths)
    for name, doc in named:
        rows = {row["schedule"]: row for row in doc["rows"]}
        for ours, theirs in PAIRS:
            if ours not in rows or theirs not in rows:
                continue
            entry = pooled.setdefault(f"seq{doc['config']['seq']}", {}).setdefault(
                f"{ours}_vs_{theirs}", {"runs": {}, "wall": [], "cpu": []})
            wall = [t / o for t, o in zip(rows[theirs]["step_times_s"],
                                          rows[ours]["step_times_s"])]
            entry["wall"] += wall
            entry["runs"][name] = round(statistics.median(wall), 4)
            if "cpu_s" in rows[ours]:
                entry["cpu"] += [t / o for t, o in zip(rows[theirs]["cpu_s"]["rounds"],
                                                       rows[ours]["cpu_s"]["rounds"])]
    for pairs in pooled.values():
        for entry in pairs.values():
            for key in ("wall", "cpu"):
                values = entry.pop(key)
                if values:
                    entry[key] = {"rounds": len(values),
                                  "median": round(statistics.median(values), 4),
                                  "ci95": _bootstrap_median(values),
                                  "share_at_least_1": round(
                                      sum(v >= 1.0 for v in values) / len(values), 3)}
    return {"pooled_from": [name for name, _ in named], "pooled": pooled}


# ----- driver -------------------------------------------------------------------------
def main(argv=None):
    args = parse_args(argv)
    if args.pool:
        result = pool(args.pool)
        emit(result, out=args.out, as_json=True)
        return result
    rows = run_workers(worker, args.pp, args,
                       config=LaunchConfig(timeout_s=3600, process_group_timeout_s=300,
                                           threads_per_rank=args.threads))[0]
    by_name = {row["schedule"]: row for row in rows}
    summary = {}
    for ours, theirs in PAIRS + (("zb-h1", "torch-InterleavedZeroBubble"),):
        if ours in by_name and theirs in by_name:
            summary[f"{ours}_vs_{theirs}_speedup"] = (by_name[theirs]["measured_s"]
                                                      / by_name[ours]["measured_s"])
            # round by round (the same load): the median and range of the paired ratios
            paired = [t / o for t, o in zip(by_name[theirs]["step_times_s"],
                                            by_name[ours]["step_times_s"])]
            summary[f"{ours}_vs_{theirs}_paired"] = spread(paired)
            # the same for the CPU seconds a step costs (their work / ours)
            summary[f"{ours}_vs_{theirs}_cpu_paired"] = spread(
                [t / o for t, o in zip(by_name[theirs]["cpu_s"]["rounds"],
                                       by_name[ours]["cpu_s"]["rounds"])])
    result = {"config": {k: v for k, v in vars(args).items() if k not in ("json", "out")},
              "machine": {"cpus": os.cpu_count(), "torch": torch.__version__,
                          "backend": "gloo"},
              "rows": rows, "summary": summary}
    emit(result, out=args.out, as_json=args.json)
    if not args.json:
        for row in rows:
            extra = (f"  predicted {row['predicted_s']:.3f}s  efficiency {row['efficiency']:.2f}"
                     if "predicted_s" in row else "")
            print(f"{row['schedule']:28s} measured {row['measured_s']:.3f}s{extra}")
        for key, value in summary.items():
            print(f"{key}: " + (f"{value:.2f}x" if isinstance(value, float) else
                                f"median {value['median']:.2f}x, {value['min']:.2f}-"
                                f"{value['max']:.2f}x"))
    return result


if __name__ == "__main__":
    main()
