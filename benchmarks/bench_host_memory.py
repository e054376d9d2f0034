"""Page faults in a CPU step: B with W deferred, with and without keeping freed host memory.

One megatron chunk (2 layers, hidden 256, ``--seq`` tokens, 4 heads) on one thread runs
``--microbatches`` microbatches three ways per round: "fused" (each B followed by its W,
as BW), "split" (every W after every B, as the zero-bubble schedules defer them) and
"native" (torch's own linear backward). Each process mode runs in its own subprocess:
``release`` (glibc's defaults) and ``keep``
(:func:`odc_pp.runtime.host_memory.keep_freed_host_memory`, what CPU training and
``bench_runtime.py`` use). Reported: the median F, B and W milliseconds per microbatch
over the rounds (the first round is a warm-up), the minor page faults of the timed rounds,
and the load average.

    .venv/bin/python benchmarks/bench_host_memory.py --json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from odc_pp.testing.bench import emit, load_1min  # noqa: E402

WAYS = ("fused", "split", "native")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=7, help="rounds (the first: warm-up)")
    parser.add_argument("--mode", choices=("keep", "release"), default=None,
                        help="internal: run one process mode and print its JSON")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results",
                                                      "host_memory_cpu.json"))
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    return parser.parse_args(argv)


def _measure(args) -> dict:
    """One process mode: per way, the median F/B/W ms per microbatch and the page faults."""
    import torch
    import torch.distributed as dist

    from odc_pp.data import Microbatch
    from odc_pp.training.distributed import standalone_process_groups
    from odc_pp.megatron.model import ModelConfig, build_chunks
    from odc_pp.runtime.host_memory import keep_freed_host_memory
    from odc_pp.runtime.wgrad import WeightGradQueue
    from odc_pp.schedule.ir import Placement

    kept = keep_freed_host_memory() if args.mode == "keep" else False
    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", rank=0, world_size=1,
                            init_method=f"tcp://127.0.0.1:{_free_port()}")
    config = ModelConfig(vocab_size=128, hidden_size=256, num_layers=2, num_attention_heads=4,
                         max_sequence_length=args.seq)
    chunk = build_chunks(config, pp_rank=0, pp_size=1, num_chunks=1,
                         placement=list(Placement)[0],
                         process_groups=standalone_process_groups())[0]
    queue = WeightGradQueue()
    queue.attach(0, chunk)
    generator = torch.Generator().manual_seed(0)
    data = [Microbatch(tokens=torch.randint(0, 128, (1, args.seq), generator=generator),
                       labels=torch.randint(0, 128, (1, args.seq), generator=generator))
            for _ in range(args.microbatches)]

    def one(way: str) -> tuple[float, float, float]:
        for module in chunk.modules():
            if hasattr(module, "native_autograd"):
                module.native_autograd = way == "native"
        f = b = w = 0.0
        for index, microbatch in enumerate(data):
            start = time.perf_counter()
            loss = chunk(None, microbatch).float().sum() / args.seq
            forward = time.perf_counter()
            with queue.deferring(0, index):
                loss.backward()
            backward = time.perf_counter()
            if way == "fused":
                queue.flush(0, index)
            f, b = f + forward - start, b + backward - forward
            w += time.perf_counter() - backward
        start = time.perf_counter()
        for index in range(len(data)):
            queue.flush(0, index)
        return f, b, w + time.perf_counter() - start

    times = {way: [] for way in WAYS}
    faults = {way: 0 for way in WAYS}
    for round_index in range(args.rounds):
        for way in WAYS[round_index % 3:] + WAYS[:round_index % 3]:
            chunk.zero_grad(set_to_none=True)
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            result = one(way)
            if round_index:
                times[way].append(result)
                faults[way] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    dist.destroy_process_group()
    per = 1e3 / args.microbatches
    return {"mode": args.mode, "keep_freed_host_memory": kept, "ways": {
        way: {"f_ms": round(statistics.median(t[0] for t in rows) * per, 2),
              "b_ms": round(statistics.median(t[1] for t in rows) * per, 2),
              "w_ms": round(statistics.median(t[2] for t in rows) * per, 2),
              "minor_page_faults": faults[way]}
        for way, rows in times.items()}}


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.mode:
        print(json.dumps(_measure(args)))
        return 0
    runs = []
    for mode in ("release", "keep"):
        load = load_1min()
        out = subprocess.run([sys.executable, __file__, "--mode", mode, "--seq", str(args.seq),
                              "--microbatches", str(args.microbatches),
                              "--rounds", str(args.rounds)],
                             capture_output=True, text=True, check=True, cwd=ROOT).stdout
        runs.append(dict(json.loads(out.strip().splitlines()[-1]), load_1min=load))
    doc = {"config": {k: v for k, v in vars(args).items() if k not in ("json", "out", "mode")},
           "runs": runs}
    text = emit(doc, out=args.out, as_json=args.json)
    if not args.json:
        for run in runs:
            for way, row in run["ways"].items():
                print(f"{run['mode']:8s} {way:7s} F {row['f_ms']:8.2f} B {row['b_ms']:8.2f} "
                      f"W {row['w_ms']:8.2f} ms/microbatch, {row['minor_page_faults']} "
                      f"page faults (load {run['load_1min']})")
    return 0 if text else 1


if __name__ == "__main__":
    sys.exit(main())
