#!/usr/bin/env python3
"""How long ``odc-pp plan`` and the LB-Mini packer take on this CPU (issue 31, Deliver 4).

* ``plan``: the 64-GPU search of ``docs/planner.md`` (Llama-3-8B at 64K tokens, H100,
  global batch 256, long-tailed histogram, 72 GB), in its own process, the seconds the
  command prints, with ``--jobs 1`` and with one process per CPU; ``--rounds`` runs of
  each, alternating.
* ``packer``: ``plan_minibatch`` in packed ``lb-mini`` mode (the training default) at
  global batch 1,024, log-normal lengths (median 2048), per replica count and token cap,
  the planner's attention cost model; CPU seconds per call.

Single-threaded CPU work, so the load average is recorded beside each number; the
targets (30 s and 5 s) are in the issue, not asserted.

    python benchmarks/bench_planner_speed.py --json --out benchmarks/results/planner_speed.json
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from odc_pp.testing.bench import emit, load_1min, spread  # noqa: E402

LLAMA3_8B_64K = ("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 "
                 "--group-query-attention --num-query-groups 8 --ffn-hidden-size 14336 "
                 "--swiglu --normalization RMSNorm --position-embedding-type rope "
                 "--vocab-size 128256 --disable-bias-linear "
                 "--untie-embeddings-and-output-weights --seq-length 65536 "
                 "--max-position-embeddings 65536")
PLAN_ARGS = ["--model-flags", LLAMA3_8B_64K, "--cluster", "h100", "--gpus", "64",
             "--lengths-histogram", "2048:55,8192:25,16384:10,32768:6,65536:4",
             "--global-batch", "256", "--memory-gb", "72"]
PACKER_CASES = ((8, 8192), (16, 4096), (32, 8192), (64, 65536))
"""(replicas, token cap) of the packer runs."""


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=1, help="plan runs (default 1)")
    parser.add_argument("--out", default=None, help="write the JSON here")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    return parser.parse_args(argv)


def time_plan(jobs: int) -> dict:
    load = load_1min()
    out = subprocess.run([sys.executable, "-m", "odc_pp.plan_command", *PLAN_ARGS,
                          "--jobs", str(jobs)],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    found = re.search(r"(\d+) configurations in ([\d.]+) s with (\d+) processes", out)
    if found is None:
        raise RuntimeError("odc-pp plan printed no 'configurations in ... s' line")
    return {"configurations": int(found.group(1)), "seconds": float(found.group(2)),
            "processes": int(found.group(3)), "load_1min": load}


def time_packer() -> list[dict]:
    import numpy as np

    from odc_pp.data.assignment import plan_minibatch
    from odc_pp.planner.inputs import ModelSpec
    from odc_pp.planner.microbatch_costs import sample_cost

    model = ModelSpec(num_layers=32, hidden_size=4096, num_attention_heads=32,
                      ffn_hidden_size=14336, vocab_size=128256, seq_length=65536,
                      gated_mlp=True, num_query_groups=8, tied=False)  # LLAMA3_8B_64K
    rng = np.random.default_rng(0)
    rows = []
    for replicas, cap in PACKER_CASES:
        lengths = np.clip(rng.lognormal(np.log(2048), 1.0, 1024).astype(int), 8, cap)
        load, start = load_1min(), time.process_time()
        plan = plan_minibatch(lengths, replicas, max_tokens=cap, mode="lb-mini", packed=True,
                              segment_attention=True, cost_model=sample_cost(model))
        rows.append({"replicas": replicas, "token_cap": cap, "global_batch": 1024,
                     "cpu_s": round(time.process_time() - start, 3),
                     "imbalance": round(plan.imbalance, 6), "load_1min": load})
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    cpus = len(os.sched_getaffinity(0))
    runs = [time_plan(jobs) for _ in range(args.rounds)
            for jobs in ((1, cpus) if _ % 2 == 0 else (cpus, 1))]
    doc = {"benchmark": "planner_speed", "plan_command": PLAN_ARGS, "cpus": cpus,
           "plan_s": {str(jobs): spread([r["seconds"] for r in runs
                                         if r["processes"] == jobs], 1)
                      for jobs in sorted({1, cpus})},
           "plan_runs": runs, "packer": time_packer()}
    emit(doc, out=args.out, as_json=args.json)
    if not args.json:
        for jobs, row in doc["plan_s"].items():
            print(f"odc-pp plan, 64 GPUs, global batch 256, {jobs} processes: "
                  f"{runs[0]['configurations']} configurations, {row['median']} s (median)")
        for row in doc["packer"]:
            print(f"lb-mini packer, batch 1024, {row['replicas']} replicas, cap "
                  f"{row['token_cap']}: {row['cpu_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
