"""Our ZB-V or interleaved runtime against PyTorch's, each in its own processes.

``bench_runtime.py`` times both runtimes inside one pair of processes, so they share one
heap: a step of one runtime can leave it trimmed or fragmented for the next step of the
other (at seq 2048 our rows paid 50,000-180,000 minor page faults in rounds that followed
PyTorch's). Training runs one runtime per process. Here 2 x pp processes start: ranks
0..pp-1 run our schedule, ranks pp..2pp-1 run PyTorch's (``ScheduleZBVZeroBubble`` or
``ScheduleInterleavedZeroBubble``) on chunks built from the same seed, each pair with its
own heap and process group. The pairs take turns, one step each, which pair goes first
alternating by round; the other pair waits in a barrier, off the CPU (``idle_cpu_s``
checks it), so at most pp ranks compute at once. Each row: step wall time (slowest rank),
CPU seconds of the step (all ranks of the pair), minor page faults; the summary pairs the
rounds. One schedule per run, so each process holds one configuration, as in training.

    .venv/bin/python benchmarks/bench_runtime_isolated.py --schedule zbv --seq 2048
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_runtime import (LayoutCache, add_shape_arguments, bench_filled,  # noqa: E402
                           bench_ours, bench_torch, make_data)
from odc_pp.testing.bench import emit, load_1min, spread  # noqa: E402
from odc_pp.testing.launch import LaunchConfig, run_workers  # noqa: E402

THEIRS = {"zbv": "torch-ZBVZeroBubble", "interleaved": "torch-InterleavedZeroBubble"}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schedule", choices=sorted(THEIRS), default="zbv")
    parser.add_argument("--fill", action="store_true",
                        help="run ours re-planned from measured costs with its gaps filled "
                             "(bench_runtime.bench_filled: as training's "
                             "--fill-pipeline-gaps, with measured memory deltas, after "
                             "profiling) instead of the uniform-cost plan")
    parser.add_argument("--memory-limit", type=float, default=None,
                        help="with --fill: the re-plan's --memory-limit, in microbatch-chunk "
                             "activations under the measured memory deltas (default: the "
                             "family's cap, ZB-V 2 pp)")
    add_shape_arguments(parser, repeats=7)
    parser.add_argument("--out", default=os.path.join(
        ROOT, "benchmarks", "results", "runtime_cpu_isolated.json"))
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    if args.repeats < 3:
        parser.error("--repeats: at least 3 rounds")
    if args.memory_limit is not None and not args.fill:
        parser.error("--memory-limit: only with --fill (the uniform plan is PyTorch's order)")
    return args


def _build(args, pair: int, group, channels):
    """This rank's runner: our runtime on pair 0, PyTorch's on pair 1."""
    from odc_pp.training.distributed import standalone_process_groups
    from odc_pp.schedule.costs import CostModel
    from odc_pp.schedule.generators import generate
    from odc_pp.schedule.lowering import lower

    cache = LayoutCache(args, standalone_process_groups(), pp_group=group, channels=channels)
    microbatches = make_data(args)
    if pair == 1:
        return bench_torch(THEIRS[args.schedule], cache, microbatches, args)
    if args.fill:
        return bench_filled(f"{args.schedule}+fill", cache, microbatches, args)
    costs = CostModel(offload_bandwidth=1.0)
    schedule = lower(generate(args.schedule, pp=args.pp,
                              num_microbatches=args.microbatches, costs=costs), costs)
    return bench_ours(args.schedule, schedule, cache, microbatches, args)[0]


def _gradient_sums(runner) -> torch.Tensor:
    """Per parameter of this rank's chunks, the sum of its gradient after one step."""
    runner.run_once()
    return torch.tensor([float(p.grad.double().sum()) if p.grad is not None else 0.0
                         for chunk in runner.chunks for p in chunk.parameters()],
                        dtype=torch.float64)


def worker(rank, world_size, args):
    from odc_pp.runtime.host_memory import keep_freed_host_memory

    torch.set_num_threads(1)
    keep_freed_host_memory()
    from odc_pp.runtime.p2p_channels import create_pipeline_channels

    pp = args.pp
    pipelines = [list(range(i * pp, (i + 1) * pp)) for i in range(2)]
    groups = [dist.new_group(ranks) for ranks in pipelines]
    channels = create_pipeline_channels(pipelines)  # every rank, both pipelines
    pair = rank // pp
    for turn in (0, 1):  # one pair builds (and profiles its warm-up) while the other waits
        if turn == pair:
            runner = _build(args, pair, groups[pair], channels)
            runner.run_once()  # one more untimed step of each pair
        dist.barrier()
    cpu_start = resource.getrusage(resource.RUSAGE_SELF)
    loads = []
    for round_index in range(args.repeats):
        loads.append(load_1min())
        for turn in ((0, 1) if round_index % 2 == 0 else (1, 0)):
            dist.barrier()  # the waiting pair blocks here
            if turn == pair:
                runner.time_one_step()
    dist.barrier()
    end = resource.getrusage(resource.RUSAGE_SELF)
    process_cpu = end.ru_utime + end.ru_stime - cpu_start.ru_utime - cpu_start.ru_stime
    own = sum(runner.cpu_seconds) / pp  # the pair's steps, per rank (roughly)
    sums = _gradient_sums(runner)
    gathered = [None] * world_size
    dist.all_gather_object(gathered, {"times": runner.times, "cpu": runner.cpu_seconds,
                                      "faults": runner.page_faults, "loads": loads,
                                      "idle_cpu_s": process_cpu - own,
                                      # the process's peak resident memory, warm-up and
                                      # (ours with --fill) the profiling steps included
                                      "max_rss_mib": end.ru_maxrss / 1024,
                                      "plan": {k: v for k, v in runner.row.items()
                                               if k in ("plan_costs", "gap_fill",
                                                        "simulated_s", "memory_limit",
                                                        "peak_activation_units")},
                                      "grad_sums": sums.tolist()})
    return gathered if rank == 0 else None


def _summary(args, gathered) -> dict:
    pp = args.pp
    rows = {}
    mine = args.schedule + ("+fill" if args.fill else "")
    for pair, name in enumerate((mine, THEIRS[args.schedule])):
        first = gathered[pair * pp]
        rows[name] = {"schedule": name, **first["plan"],
                      "measured_s": statistics.median(first["times"]),
                      "step_times_s": first["times"], "cpu_s": spread(first["cpu"]),
                      "page_faults_rounds": first["faults"],
                      "idle_cpu_s_per_rank": [round(g["idle_cpu_s"], 3)
                                              for g in gathered[pair * pp:(pair + 1) * pp]],
                      "max_rss_mib_per_rank": [round(g["max_rss_mib"])
                                               for g in gathered[pair * pp:(pair + 1) * pp]]}
    ours, theirs = rows[mine], rows[THEIRS[args.schedule]]
    worst, nonzero = 0.0, 0
    for rank in range(pp):
        a = torch.tensor(gathered[rank]["grad_sums"])
        b = torch.tensor(gathered[pp + rank]["grad_sums"])
        worst = max(worst, float(((a - b).abs() / a.abs().clamp_min(1e-6)).max()))
        nonzero += int((a != 0).sum())
    return {"rows": list(rows.values()), "load_1min": gathered[0]["loads"],
            "grad_sum_max_rel_diff": worst, "grad_sums_nonzero": nonzero,
            "summary": {
                "speedup": theirs["measured_s"] / ours["measured_s"],
                "paired": spread([t / o for t, o in zip(theirs["step_times_s"],
                                                        ours["step_times_s"])]),
                "cpu_paired": spread([t / o for t, o in zip(theirs["cpu_s"]["rounds"],
                                                            ours["cpu_s"]["rounds"])])}}


def main(argv=None):
    args = parse_args(argv)
    started = time.time()
    gathered = run_workers(worker, 2 * args.pp, args,
                           config=LaunchConfig(timeout_s=3600, process_group_timeout_s=600,
                                               threads_per_rank=1))[0]
    result = {"config": {k: v for k, v in vars(args).items() if k not in ("json", "out")},
              "machine": {"cpus": os.cpu_count(), "torch": torch.__version__,
                          "backend": "gloo"},
              "wall_s": round(time.time() - started, 1), **_summary(args, gathered)}
    emit(result, out=args.out, as_json=args.json)
    if not args.json:
        s = result["summary"]
        for row in result["rows"]:
            print(f"{row['schedule']:28s} measured {row['measured_s']:.3f}s  "
                  f"cpu {row['cpu_s']['median']:.2f}s  faults {row['page_faults_rounds']}  "
                  f"idle cpu/rank {row['idle_cpu_s_per_rank']}  "
                  f"max RSS MiB/rank {row['max_rss_mib_per_rank']}")
        print(f"{result['rows'][0]['schedule']} vs {THEIRS[args.schedule]}: "
              f"{s['speedup']:.2f}x, paired "
              f"median {s['paired']['median']:.2f}x ({s['paired']['min']:.2f}-"
              f"{s['paired']['max']:.2f}), cpu paired {s['cpu_paired']['median']:.2f}x; "
              f"gradient sums within {result['grad_sum_max_rel_diff']:.1e} "
              f"({result['grad_sums_nonzero']} non-zero)")
    return result


if __name__ == "__main__":
    main()
