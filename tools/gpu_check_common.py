"""The parts of tools/gpu_check.py that are not stages: the check and stage records, the
JSON record and its log tarball, the parsers of command output, and running a command
(with the run's time budget, killing the whole process tree on a timeout) or a training
run. Imported by gpu_check.py (which re-exports the public names)."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import tarfile
import time
from dataclasses import dataclass
from typing import Callable

RECORD_NAME = "gpu_check.json"
LOGS_NAME = "gpu_check_logs.tar.gz"
STAGE_LIMIT_S = 600
"""No stage may take longer than one command may (10 minutes)."""
LOSS_RTOL = 1e-4
LOSS_ATOL = 1e-4
GATHER_MIN_MIB = 64
"""Benchmark rows from this size on enter the record's gather_vs_d2d."""

__all__ = ["Check", "Stage", "Context", "assemble_record", "bench_ratios", "compare_losses",
           "pytest_counts", "replan_costs", "attention_checks", "write_outputs", "run_command"]


@dataclass(frozen=True, kw_only=True)
class Check:
    """One named result of a stage."""

    name: str
    """Key in the record's ``checks``."""
    passed: bool
    """Whether it passed."""
    detail: str
    """What was measured / why it failed (one line or a short paragraph)."""


@dataclass(frozen=True, kw_only=True)
class Stage:
    """One step of the GPU check; ``run(context)`` returns its checks."""

    name: str
    """Argument of ``--stage``."""
    summary: str
    """What the stage does (``--list``)."""
    timeout_s: int
    """Wall-clock budget of the stage's commands together (<= STAGE_LIMIT_S)."""
    run: Callable[["Context"], list[Check]]
    """The stage itself."""

    def __post_init__(self):
        if not 0 < self.timeout_s <= STAGE_LIMIT_S:
            raise ValueError(f"stage {self.name}: timeout_s must be in (0, {STAGE_LIMIT_S}]")


@dataclass(kw_only=True)
class Context:
    """What the stages share: the interpreter, the repository root, a log folder."""

    python: str
    """Interpreter to run pytest, setup.py and pretrain_gpt.py with."""
    root: str
    """Repository root (commands run there)."""
    log_dir: str
    """Where each command's output is kept."""
    bench: dict | None = None
    """The transport benchmark's JSON once that stage ran."""
    quick: bool = False
    """``--quick``: the attention stage runs one shape."""
    deadline: float | None = None
    """``time.monotonic()`` by which every command must have ended (``--budget-s``)."""

    def time_left(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - time.monotonic()


# ----- pure helpers (CPU-tested) -------------------------------------------------------------
def bench_ratios(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(gather_vs_d2d rows at >= 64 MiB, scatter_vs_local_add rows) of the transport
    benchmark's rows."""
    gather = [{"mib": row["mib"], "gather_alone_vs_d2d": row["gather_alone_vs_d2d"],
               "gather_vs_d2d": row["gather_vs_d2d"]}
              for row in rows if row["mib"] >= GATHER_MIN_MIB]
    scatter = [{"mib": row["mib"], "scatter_vs_local_add": row["scatter_vs_local_add"]}
               for row in rows]
    return gather, scatter


def assemble_record(previous: dict | None, *, device: str, date: str, torch_version: str,
                    megatron_core: str | None, checks: list[Check],
                    bench: dict | None) -> dict:
    """The gpu_check.json record: ``previous`` checks (same device and torch) updated with
    ``checks``; the benchmark ratios from ``bench`` (else kept from ``previous``)."""
    same_machine = (previous is not None and previous.get("device") == device
                    and previous.get("torch") == torch_version)
    merged = dict(previous["checks"]) if same_machine else {}
    for check in checks:
        merged[check.name] = {"passed": bool(check.passed), "detail": check.detail}
    if bench is not None:
        gather, scatter = bench_ratios(bench["rows"])
    elif same_machine:
        gather, scatter = previous.get("gather_vs_d2d"), previous.get("scatter_vs_local_add")
    else:
        gather = scatter = None
    if megatron_core is None and same_machine:
        megatron_core = previous.get("megatron_core")
    return {"device": device, "date": date, "torch": torch_version,
            "megatron_core": megatron_core, "checks": merged, "gather_vs_d2d": gather,
            "scatter_vs_local_add": scatter}


def compare_losses(reference: list[float], other: list[float], *, rtol: float = LOSS_RTOL,
                   atol: float = LOSS_ATOL) -> tuple[bool, str]:
    """Whether two loss curves agree element-wise to rtol/atol (same length, finite)."""
    if not reference or len(reference) != len(other):
        return False, f"loss curves differ in length: {len(reference)} vs {len(other)}"
    worst = max(abs(a - b) for a, b in zip(reference, other))
    finite = all(math.isfinite(x) for x in reference + other)
    ok = finite and all(abs(a - b) <= atol + rtol * abs(a) for a, b in zip(reference, other))
    return ok, f"max |loss difference| {worst:.3g} over {len(reference)} iterations " \
               f"(rtol {rtol:g}, atol {atol:g}){'' if finite else '; non-finite loss'}"


def pytest_counts(output: str) -> dict[str, int]:
    """Outcome counts from pytest's last summary line ("3 passed, 1 skipped in 2.0s")."""
    lines = [line for line in output.splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    if not lines:
        return {}
    return {word: int(count) for count, word in
            re.findall(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected)",
                       lines[-1])}


def replan_costs(output: str) -> list[tuple[float, float, float]] | None:
    """(T_F, T_B, T_W) ms per stage from the training log's zb-auto re-plan line."""
    match = re.search(r"zb-auto re-planned .*?T_F/T_B/T_W ms per stage: ([0-9./ ,]+);", output)
    if not match:
        return None
    return [tuple(float(x) for x in part.split("/")) for part in match.group(1).split(", ")]


# ----- running commands --------------------------------------------------------------------
def run_command(context: Context, name: str, command: list[str], *, timeout_s: float,
                env: dict | None = None) -> tuple[int, str]:
    """Run ``command`` in the repository root; (exit status, stdout+stderr). A timeout is
    exit status 124. The output is also kept in ``log_dir/<name>.log``."""
    merged_env = dict(os.environ, PYTHONPATH=context.root, **(env or {}))
    if context.deadline is not None:
        timeout_s = min(timeout_s, context.time_left() - 5)
        if timeout_s < 10:
            return 124, f"[gpu_check] not run: no time left in --budget-s for {name}"
    # a session of its own: a timeout kills the whole tree (torchrun's workers too), whose
    # open stdout would otherwise keep the read below waiting
    process = subprocess.Popen(command, cwd=context.root, env=merged_env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout_s)
        status = process.returncode
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        status = 124
        output = (output or "") + f"\n[gpu_check] timed out after {timeout_s:.0f} s"
    os.makedirs(context.log_dir, exist_ok=True)
    with open(os.path.join(context.log_dir, f"{name}.log"), "w") as handle:
        handle.write(" ".join(command) + "\n" + output)
    return status, output


def _tail(output: str, lines: int = 8) -> str:
    return " | ".join(line.strip() for line in output.strip().splitlines()[-lines:])


def _train(context: Context, name: str, flags: list[str], *, timeout_s: float,
           env: dict | None = None, nproc: int = 1) -> tuple[int, str, list[dict]]:
    """pretrain_gpt.py with ``flags`` (``nproc`` > 1: under torchrun on this host); the
    exit status, output and rank 0's JSON log records."""
    log_json = os.path.join(context.log_dir, f"{name}.jsonl")
    if os.path.exists(log_json):
        os.remove(log_json)
    launcher = [context.python] if nproc == 1 else \
        [context.python, "-m", "torch.distributed.run", "--standalone",
         "--nproc-per-node", str(nproc)]
    status, output = run_command(context, name, [*launcher, "pretrain_gpt.py", *flags,
                                                 "--log-json", log_json],
                                 timeout_s=timeout_s, env=env)
    records = []
    if os.path.exists(log_json):
        with open(log_json) as handle:
            records = [json.loads(line) for line in handle if line.strip()]
    return status, output, records


def _training_check(name: str, status: int, output: str, records: list[dict],
                    iterations: int) -> Check:
    losses = [record["loss"] for record in records]
    if status != 0:
        return Check(name=name, passed=False, detail=f"exit {status}: {_tail(output)}")
    finite = losses and all(math.isfinite(loss) for loss in losses)
    peak = max((record.get("peak_memory_mb") or 0.0 for record in records), default=0.0)
    ok = len(losses) == iterations and bool(finite)
    return Check(name=name, passed=ok,
                 detail=f"{len(losses)}/{iterations} iterations, losses "
                        f"{[round(x, 4) for x in losses]}, peak memory {peak:.0f} MiB (GPU: reserved)")


def attention_checks(result: dict) -> list[Check]:
    """The checks of bench_packed_attention.py's JSON: parity (every kernel within its
    bound) and the timing of each kernel, the one ``auto`` picks in bf16 measured."""
    parity = ", ".join(
        f"{row['kernel']} {row['dtype']} " + (f"{row['error']:.2e}" if row.get("error") is not
                                              None else f"FAILED {row.get('failure', '')}")
        + (f" (<= {row['bound']:.2e})" if "bound" in row else "")
        for row in result["parity"])
    timed = {row["kernel"]: row for row in result["timing"]}
    auto = result["auto_kernel_bf16"]
    timing = ", ".join(f"{name} " + (f"{row['fwd_bwd_ms']:.2f} ms" if row.get("fwd_bwd_ms")
                                     is not None else f"FAILED {row.get('failure', '')}")
                       for name, row in timed.items())
    return [Check(name="packed_attention_parity", passed=bool(result["passed"]),
                  detail=f"varlen backend {result['varlen_backend']}; auto picks "
                         f"{auto} (bf16), {result['auto_kernel_fp32']} (fp32); error vs "
                         f"the old dense path in fp32: {parity}"),
            Check(name="packed_attention_timing",
                  passed=timed.get(auto, {}).get("fwd_bwd_ms") is not None,
                  detail=f"fwd+bwd, CUDA events, median: {timing}")]


def write_outputs(out_dir: str, record: dict, log_dir: str) -> None:
    """``out_dir/gpu_check.json`` and ``out_dir/gpu_check_logs.tar.gz`` (every file of
    ``log_dir``, flat): two files, whatever the number of commands run."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, RECORD_NAME), "w") as handle:
        json.dump(record, handle, indent=2)
        handle.write("\n")
    with tarfile.open(os.path.join(out_dir, LOGS_NAME), "w:gz") as tar:
        if os.path.isdir(log_dir):
            for name in sorted(os.listdir(log_dir)):
                tar.add(os.path.join(log_dir, name), arcname=name)


def _probe(context: Context, name: str, code: str) -> str | None:
    """The last output line of ``python -c code``, None when it failed."""
    status, output = run_command(context, name, [context.python, "-c", code], timeout_s=90)
    lines = output.strip().splitlines()
    return lines[-1].strip() if status == 0 and lines else None
