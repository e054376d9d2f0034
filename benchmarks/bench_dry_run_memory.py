"""Dry-run memory table (docs/memory.md): Llama-3-8B and a 70B-class model at real size.

For each row, runs ``odc-pp memory`` (odc_pp.training.dry_run) for the pipeline ranks
named in ``ROWS`` (tp rank 0 and dp rank 0: the other tp/dp ranks hold the same sizes),
one process per rank (each sets up its own fake process group), and writes
benchmarks/results/dry_run_memory.json: per row and rank the dry run's report (its
per-category bytes and the categories with its exact advice applied), plus the worst
rank. ``--from-dir D`` aggregates JSON files a previous run left in D (named
``<row>_<rank>.json``) instead of running.

    python benchmarks/bench_dry_run_memory.py [--from-dir D] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPORT_KEY = "job"  # odc_pp.training.dry_run.REPORT_KEY (the JSON's one key)
LLAMA3_8B = ("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 "
             "--group-query-attention --num-query-groups 8 --ffn-hidden-size 14336")
LLAMA_70B = ("--num-layers 80 --hidden-size 8192 --num-attention-heads 64 "
             "--group-query-attention --num-query-groups 8 --ffn-hidden-size 28672")
SHARED = ("--seq-length 8192 --max-position-embeddings 8192 --swiglu --normalization RMSNorm "
          "--position-embedding-type rope --disable-bias-linear --vocab-size 128256 --bf16 "
          "--mock-data --micro-batch-size 1 --global-batch-size 512 --lr 2e-5 "
          "--train-iters 10 --clip-grad 1.0 --enable-optimizer-post-validation "
          "--dp-mode odc --load-balance lb-mini --max-tokens-per-microbatch 8192 "
          "--recompute-lgd --untie-embeddings-and-output-weights")  # Llama 3: untied
ROWS = {
    "8b_pp2_dp4_zbv": dict(model=LLAMA3_8B, world=8, ranks=[0, 1], flags=(
        "--pipeline-model-parallel-size 2 --pipeline-schedule zbv --num-model-chunks 2"),
        advised="--nondeterministic-dp --memory-limit 3"),
    "8b_pp4_dp2_zbh1": dict(model=LLAMA3_8B, world=8, ranks=[0, 3], flags=(
        "--pipeline-model-parallel-size 4 --pipeline-schedule zb-h1"),
        advised="--nondeterministic-dp --pipeline-schedule 1f1b"),
    "70b_tp8_pp4_dp2_zbh1": dict(model=LLAMA_70B, world=64, ranks=[0, 24], flags=(
        "--tensor-model-parallel-size 8 --sequence-parallel "
        "--pipeline-model-parallel-size 4 --pipeline-schedule zb-h1"),
        advised="--nondeterministic-dp"),
}
"""Per row: the flags the first dry run advised for its worst rank (``advised``; every
advised row also drops --enable-optimizer-post-validation), run again as the row
``<name>_advised`` to measure them directly."""
DROP = "--enable-optimizer-post-validation"


def row_flags(row: dict, advised: bool) -> list[str]:
    flags = [*row["model"].split(), *SHARED.split(), *row["flags"].split()]
    if advised:
        flags = [f for f in flags if f != DROP] + row["advised"].split()
    return flags


def run_rank(name: str, row: dict, rank: int, directory: str, advised: bool = False) -> str:
    path = os.path.join(directory, f"{name}{'_advised' if advised else ''}_{rank}.json")
    argv = [sys.executable, "-m", "odc_pp.cli", "memory", *row_flags(row, advised),
            "--dry-run-rank", str(rank),
            "--dry-run-world-size", str(row["world"]), "--dry-run-json", path]
    subprocess.run(argv, cwd=ROOT, check=False, env=dict(os.environ, PYTHONPATH=ROOT))
    return path


def aggregate(directory: str) -> dict:
    out = {}
    for name, row, advised in [(n, r, a) for n, r in ROWS.items() for a in (False, True)]:
        ranks = {}
        tag = f"{name}_advised" if advised else name
        for rank in row["ranks"]:
            path = os.path.join(directory, f"{tag}_{rank}.json")
            if os.path.exists(path):
                with open(path) as handle:
                    ranks[rank] = json.load(handle)
        if not ranks:
            continue
        worst = max(ranks, key=lambda r: ranks[r][REPORT_KEY]["total_gb"])
        out[tag] = {"flags": " ".join(row_flags(row, advised)),
                     "world_size": row["world"], "ranks": ranks, "worst_rank": worst,
                     "measured_ranks": row["ranks"]}
    return out


SHORT = {"params_gathered": "params gathered", "params_sharded": "params shard",
         "weight_grads": "wgrads+pushes", "grad_accumulators": "grad acc",
         "optimizer_state": "optimizer", "odc_staging": "ODC staging",
         "post_validation_snapshot": "PV snapshot", "sends": "sends", "receives": "recvs",
         "activations": "activations", "w_held": "W-held", "offload_device": "offload",
         "transient": "transient"}


def markdown(table: dict) -> str:
    """One block per row: the worst rank's GB per category for the job and with the dry
    run's advice applied, and the advice."""
    lines = []
    for name, row in table.items():
        rank = row["worst_rank"]
        data = row["ranks"][rank] if rank in row["ranks"] else row["ranks"][str(rank)]
        job = data[REPORT_KEY]
        advised = job["advised"] or job["categories"]
        lines += [f"**{name}** (worst of ranks {row['measured_ranks']}: rank {rank}, "
                  f"{row['world_size']} GPUs)", "",
                  "| GB | " + " | ".join(SHORT.values()) + " | total |",
                  "|---|" + "---|" * (len(SHORT) + 1)]
        for label, cats in (("this job", job["categories"]), ("with the advice", advised)):
            cells = [f"{cats.get(k, 0) / 1e9:.1f}" for k in SHORT]
            lines.append(f"| {label} | " + " | ".join(cells) +
                         f" | **{sum(cats.values()) / 1e9:.1f}** |")
        advice = "; ".join(job["advice"]) or "none (fits with these flags)"
        lines += ["", f"Advice printed by the dry run: {advice}", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from-dir", default=None)
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results",
                                                      "dry_run_memory.json"))
    args = parser.parse_args(argv)
    directory = args.from_dir or tempfile.mkdtemp(prefix="dry_run_memory_")
    if args.from_dir is None:
        for name, row in ROWS.items():
            for rank in row["ranks"]:
                run_rank(name, row, rank, directory)
                run_rank(name, row, rank, directory, advised=True)
    table = aggregate(directory)
    with open(args.out, "w") as handle:
        json.dump(table, handle, indent=1)
    print(markdown(json.loads(json.dumps(table))))
    print(f"wrote {args.out} ({len(table)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
