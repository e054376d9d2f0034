#!/usr/bin/env python3
"""One-command GPU validation of odc-pp (issue 11, item 8); ``tools/gpu_check.sh`` runs it.

Target machine: one H100 or H200, Python 3.12, torch with CUDA, nvcc, no network;
megatron-core, when not installed, comes from the cp312 wheel carried in ``.whl/``
(``pip install --no-index --find-links .whl``).

Stages, in order (each fits the 10-minute limit of one command; ``--stage NAME`` runs one,
``--list`` prints them):

* ``setup``: megatron-core importable (installed from ``.whl/`` when missing).
* ``build``: both extensions (``odc_pp._C`` and ``odc_pp._C_cuda``) built in place; the
  CUDA one sees a device.
* ``pytest-gpu``: ``pytest -m gpu`` (the CUDA IPC transport, offload with reserved-memory
  accounting, CUDA-event timings, the CUDA RNG state in checkpoints, ...).
* ``bench-transport``: ``benchmarks/bench_transport_gpu.py`` (gather vs device-to-device
  copy, scatter-accumulate vs a local add; 2 processes sharing the GPU).
* ``train-zbv-bf16``: ``pretrain_gpt.py`` with ZB-V, bf16 and optimizer post-validation.
* ``train-1f1b-fp32``: 1F1B in fp32 on the GPU and the same run on CPU; losses agree to
  ``LOSS_RTOL`` / ``LOSS_ATOL``.
* ``train-offload``: the offload schedule (``--cpu-offload``); the log's peak memory is the
  caching allocator's peak *reservation*.
* ``train-zb-auto``: ZB-auto re-planned from measured costs (CUDA-event action timings).
* ``bench-tp``: the GPU rows of ``benchmarks/bench_tp.py`` (tp=2 vs pp=2 vs pp=2 + offload,
  ``benchmarks/results/tp_gpu.json``); needs two GPUs, so on one it records ``bench_tp_gpu_skipped``.

Pipeline parallelism on one GPU: the training frontend gives rank r the device
``cuda:LOCAL_RANK`` and NCCL refuses two ranks on one GPU, and gloo's point-to-point
carries host memory, not CUDA tensors; so the training stages run pp=1 (all of a rank's
model chunks on the one GPU: ZB-V at pp=1 still runs its two chunks in V order). pp >= 2
over NCCL needs two GPUs and is not covered here.

Every stage writes its checks into ``benchmarks/results/gpu_check.json`` (merged with the
checks of earlier stages of the same device and torch): ``device``, ``date``, ``torch``,
``megatron_core``, ``checks`` (name -> {passed, detail}), ``gather_vs_d2d`` (rows of at least
64 MiB) and ``scatter_vs_local_add``. Exit status: 0 when every check of the stages run
passed, 1 otherwise, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import math
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULT_PATH = os.path.join("benchmarks", "results", "gpu_check.json")
BENCH_PATH = os.path.join("benchmarks", "results", "transport_gpu.json")
STAGE_LIMIT_S = 600
"""No stage may take longer than one command may (10 minutes)."""
LOSS_RTOL = 1e-4
LOSS_ATOL = 1e-4
GATHER_TARGET = 0.7
"""gather (rank 0 alone) / device-to-device copy at >= 64 MiB (issue 3's target)."""
GATHER_MIN_MIB = 64
NO_DEVICE = "no CUDA device"

# A small GPT that the GPU runs in seconds; the fp32 comparison uses a smaller one so the
# CPU reference stays fast.
GPU_MODEL = ["--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "4",
             "--seq-length", "512", "--max-position-embeddings", "512", "--mock-data",
             "--vocab-size", "1024", "--micro-batch-size", "2", "--global-batch-size", "16",
             "--lr", "1e-3", "--min-lr", "1e-4", "--lr-warmup-iters", "2", "--seed", "11",
             "--no-progress-bar", "--log-interval", "1", "--train-iters", "8",
             "--pipeline-model-parallel-size", "1", "--distributed-timeout-minutes", "3"]
PARITY_MODEL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                "--seq-length", "64", "--max-position-embeddings", "64", "--mock-data",
                "--vocab-size", "128", "--micro-batch-size", "2", "--global-batch-size", "8",
                "--lr", "1e-3", "--min-lr", "1e-4", "--lr-warmup-iters", "1", "--seed", "5",
                "--no-progress-bar", "--log-interval", "1", "--train-iters", "5",
                "--pipeline-model-parallel-size", "1", "--distributed-timeout-minutes", "3"]

__all__ = ["Check", "Stage", "STAGES", "stage_names", "select_stages", "assemble_record",
           "bench_ratios", "compare_losses", "pytest_counts", "replan_costs", "main"]


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


# ----- pure helpers (CPU-tested) -------------------------------------------------------------
def stage_names() -> list[str]:
    return [stage.name for stage in STAGES]


def select_stages(requested: list[str] | None) -> list[Stage]:
    """The stages to run, in pipeline order: all when ``requested`` is empty or ["all"]; a
    ValueError names an unknown one."""
    if not requested or requested == ["all"]:
        return list(STAGES)
    unknown = [name for name in requested if name not in stage_names()]
    if unknown:
        raise ValueError(f"unknown --stage {unknown}; choose from {stage_names()} or all")
    return [stage for stage in STAGES if stage.name in requested]


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
    try:
        done = subprocess.run(command, cwd=context.root, env=merged_env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout_s, check=False)
        status, output = done.returncode, done.stdout
    except subprocess.TimeoutExpired as expired:
        status = 124
        output = (expired.stdout or "") if isinstance(expired.stdout, str) else ""
        output += f"\n[gpu_check] timed out after {timeout_s:.0f} s"
    os.makedirs(context.log_dir, exist_ok=True)
    with open(os.path.join(context.log_dir, f"{name}.log"), "w") as handle:
        handle.write(" ".join(command) + "\n" + output)
    return status, output


def _tail(output: str, lines: int = 8) -> str:
    return " | ".join(line.strip() for line in output.strip().splitlines()[-lines:])


def _train(context: Context, name: str, flags: list[str], *, timeout_s: float,
           env: dict | None = None) -> tuple[int, str, list[dict]]:
    log_json = os.path.join(context.log_dir, f"{name}.jsonl")
    if os.path.exists(log_json):
        os.remove(log_json)
    status, output = run_command(context, name, [context.python, "pretrain_gpt.py", *flags,
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


# ----- stages ------------------------------------------------------------------------------
def _stage_setup(context: Context) -> list[Check]:
    probe = [context.python, "-c", "import megatron.core as m; print(m.__version__)"]
    status, output = run_command(context, "setup-probe", probe, timeout_s=120)
    if status != 0:
        wheels = sorted(glob.glob(os.path.join(context.root, ".whl", "megatron_core-*.whl")))
        if not wheels:
            return [Check(name="megatron_core", passed=False,
                          detail="megatron-core is not installed and .whl/ holds no "
                                 "megatron_core-*.whl to install it from")]
        status, output = run_command(
            context, "setup-install",
            [context.python, "-m", "pip", "install", "--no-index", "--find-links",
             os.path.join(context.root, ".whl"), wheels[-1]], timeout_s=300)
        if status != 0:
            return [Check(name="megatron_core", passed=False,
                          detail=f"pip install --no-index {os.path.basename(wheels[-1])} "
                                 f"failed: {_tail(output)}")]
        status, output = run_command(context, "setup-probe", probe, timeout_s=120)
    return [Check(name="megatron_core", passed=status == 0,
                  detail=output.strip().splitlines()[-1] if output.strip() else "no output")]


def _stage_build(context: Context) -> list[Check]:
    status, output = run_command(context, "build",
                                 [context.python, "setup.py", "build_ext", "--inplace"],
                                 timeout_s=480, env={"ODC_PP_NO_CUDA": "0"})
    if status != 0:
        return [Check(name="build_extensions", passed=False,
                      detail=f"setup.py build_ext failed (exit {status}): {_tail(output)}")]
    probe = ("import odc_pp._C, odc_pp._C_cuda as c; n = c.device_count(); "
             "print('devices', n); assert n >= 1, 'odc_pp._C_cuda sees no CUDA device'")
    status, output = run_command(context, "build-probe", [context.python, "-c", probe],
                                 timeout_s=60)
    return [Check(name="build_extensions", passed=status == 0, detail=_tail(output, 3))]


def _stage_pytest(context: Context) -> list[Check]:
    status, output = run_command(
        context, "pytest-gpu",
        [context.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu",
         "-rfEs", "tests"], timeout_s=580)
    counts = pytest_counts(output)
    ok = status == 0 and counts.get("passed", 0) > 0 and not counts.get("failed")
    failed = [line for line in output.splitlines() if line.startswith(("FAILED", "ERROR"))]
    return [Check(name="pytest_gpu", passed=ok,
                  detail=f"exit {status}, {counts}" + (f"; {failed[:10]}" if failed else ""))]


def _stage_bench(context: Context) -> list[Check]:
    out = os.path.join(context.root, BENCH_PATH)
    status, output = run_command(
        context, "bench-transport",
        [context.python, "benchmarks/bench_transport_gpu.py", "--json", "--out", out,
         "--sizes-mib", "16", "64", "256", "1024"], timeout_s=560)
    if status != 0 or not os.path.exists(out):
        return [Check(name="bench_transport_gpu", passed=False,
                      detail=f"exit {status}: {_tail(output)}")]
    with open(out) as handle:
        context.bench = json.load(handle)
    gather, scatter = bench_ratios(context.bench["rows"])
    worst = min((row["gather_alone_vs_d2d"] for row in gather), default=float("nan"))
    return [Check(name="bench_transport_gpu", passed=True,
                  detail=f"{len(context.bench['rows'])} sizes measured"),
            Check(name="gather_vs_d2d_target", passed=bool(gather) and worst >= GATHER_TARGET,
                  detail=f"gather (rank 0 alone) / d2d copy at >= {GATHER_MIN_MIB} MiB: worst "
                         f"{worst:.2f} (target {GATHER_TARGET})"),
            Check(name="scatter_vs_local_add", passed=True,
                  detail=", ".join(f"{row['mib']:.0f} MiB {row['scatter_vs_local_add']:.2f}x"
                                   for row in scatter))]


def _stage_zbv(context: Context) -> list[Check]:
    flags = GPU_MODEL + ["--pipeline-schedule", "zbv", "--bf16",
                         "--enable-optimizer-post-validation"]
    status, output, records = _train(context, "train-zbv-bf16", flags, timeout_s=560)
    return [_training_check("train_zbv_bf16_post_validation", status, output, records, 8)]


def _stage_parity(context: Context) -> list[Check]:
    flags = PARITY_MODEL + ["--pipeline-schedule", "1f1b"]
    gpu = _train(context, "train-1f1b-fp32-gpu", flags, timeout_s=250)
    cpu = _train(context, "train-1f1b-fp32-cpu", flags, timeout_s=300,
                 env={"CUDA_VISIBLE_DEVICES": ""})
    checks = [_training_check("train_1f1b_fp32_gpu", gpu[0], gpu[1], gpu[2], 5),
              _training_check("train_1f1b_fp32_cpu", cpu[0], cpu[1], cpu[2], 5)]
    if all(check.passed for check in checks):
        ok, detail = compare_losses([r["loss"] for r in cpu[2]], [r["loss"] for r in gpu[2]])
    else:
        ok, detail = False, "a run failed (see the two checks above)"
    return checks + [Check(name="train_1f1b_fp32_gpu_matches_cpu", passed=ok, detail=detail)]


def _stage_offload(context: Context) -> list[Check]:
    flags = GPU_MODEL + ["--pipeline-schedule", "offload", "--cpu-offload"]
    status, output, records = _train(context, "train-offload", flags, timeout_s=560)
    check = _training_check("train_offload", status, output, records, 8)
    reserved = [record.get("peak_memory_mb") for record in records]
    if check.passed and not all(value and value > 0 for value in reserved):
        check = Check(name=check.name, passed=False,
                      detail=f"peak reserved memory missing from the log: {reserved}")
    return [check]


def _stage_zb_auto(context: Context) -> list[Check]:
    flags = GPU_MODEL + ["--pipeline-schedule", "zb-auto"]
    status, output, records = _train(context, "train-zb-auto", flags, timeout_s=560)
    check = _training_check("train_zb_auto", status, output, records, 8)
    costs = replan_costs(output)
    measured = bool(costs) and all(t_f > 0 and t_b > 0 for t_f, t_b, _ in costs)
    return [check, Check(name="zb_auto_replanned_from_event_timings",
                         passed=check.passed and measured,
                         detail=f"measured T_F/T_B/T_W ms per stage: {costs}" if costs
                         else "no 'zb-auto re-planned' line in the output")]


def _stage_bench_tp(context: Context) -> list[Check]:
    """The GPU rows of benchmarks/bench_tp.py (tp=2 vs pp=2 vs pp=2 + offload): two
    processes on two GPUs (NCCL refuses two ranks on one GPU)."""
    status, output = run_command(
        context, "gpu-count", [context.python, "-c",
                               "import torch; print(torch.cuda.device_count())"],
        timeout_s=60)
    count = int(output.strip().splitlines()[-1]) if status == 0 and \
        output.strip().splitlines()[-1].isdigit() else 0
    if count < 2:
        # not a failure of this machine, and not a measurement: named as skipped
        return [Check(name="bench_tp_gpu_skipped", passed=True,
                      detail=f"not run: {count} GPU(s); tp=2 needs two GPUs")]
    out = os.path.join(context.root, "benchmarks", "results", "tp_gpu.json")
    status, output = run_command(
        context, "bench-tp", [context.python, "benchmarks/bench_tp.py", "--json", "--out",
                              out, "--rounds", "2"], timeout_s=540)
    return [Check(name="bench_tp_gpu", passed=status == 0 and os.path.exists(out),
                  detail=f"exit {status}: {_tail(output, 3)}")]


STAGES: tuple[Stage, ...] = (
    Stage(name="setup", summary="megatron-core importable (installed from .whl/ if missing)",
          timeout_s=540, run=_stage_setup),
    Stage(name="build", summary="build odc_pp._C and odc_pp._C_cuda in place",
          timeout_s=540, run=_stage_build),
    Stage(name="pytest-gpu", summary="pytest -m gpu", timeout_s=580, run=_stage_pytest),
    Stage(name="bench-transport", summary="benchmarks/bench_transport_gpu.py",
          timeout_s=560, run=_stage_bench),
    Stage(name="train-zbv-bf16", summary="pretrain_gpt.py: zbv, bf16, post-validation",
          timeout_s=560, run=_stage_zbv),
    Stage(name="train-1f1b-fp32", summary="pretrain_gpt.py: 1f1b fp32, GPU vs CPU losses",
          timeout_s=550, run=_stage_parity),
    Stage(name="train-offload", summary="pretrain_gpt.py: offload schedule, reserved memory",
          timeout_s=560, run=_stage_offload),
    Stage(name="train-zb-auto", summary="pretrain_gpt.py: zb-auto re-planned from events",
          timeout_s=560, run=_stage_zb_auto),
    Stage(name="bench-tp", summary="benchmarks/bench_tp.py on two GPUs (skipped on one)",
          timeout_s=600, run=_stage_bench_tp),
)


# ----- main --------------------------------------------------------------------------------
def _environment(python: str) -> dict:
    probe = ("import json, torch\n"
             "try:\n    import megatron.core as m; mc = m.__version__\n"
             "except Exception:\n    mc = None\n"
             "print(json.dumps({'device': torch.cuda.get_device_name(0) "
             f"if torch.cuda.is_available() else {NO_DEVICE!r}, "
             "'torch': torch.__version__, 'megatron_core': mc}))")
    done = subprocess.run([python, "-c", probe], text=True, capture_output=True, check=False)
    if done.returncode != 0:
        return {"device": "unknown", "torch": "unknown", "megatron_core": None}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", action="append",
                        help=f"run only this stage (repeatable): {', '.join(stage_names())}, all")
    parser.add_argument("--list", action="store_true", help="print the stages and exit")
    parser.add_argument("--python", default=sys.executable, help="interpreter for the stages")
    parser.add_argument("--out", default=os.path.join(ROOT, RESULT_PATH))
    parser.add_argument("--log-dir", default=os.path.join(ROOT, "out", "gpu_check"))
    parser.add_argument("--allow-cpu", action="store_true",
                        help="run without a CUDA device (tries the script itself; the "
                             "record then proves nothing about GPUs)")
    args = parser.parse_args(argv)
    if args.list:
        for stage in STAGES:
            print(f"{stage.name:16s} {stage.summary} (<= {stage.timeout_s} s)")
        return 0
    try:
        stages = select_stages(args.stage)
    except ValueError as error:
        parser.error(str(error))
    context = Context(python=args.python, root=ROOT, log_dir=args.log_dir)
    if not args.allow_cpu and _environment(args.python)["device"] == NO_DEVICE:
        print(f"gpu_check: {args.python} sees no CUDA device (torch.cuda.is_available() is "
              "False); run this on the GPU machine (or pass --allow-cpu to try the script)",
              file=sys.stderr)
        return 2
    all_passed = True
    for stage in stages:
        print(f"[gpu_check] stage {stage.name}: {stage.summary}", flush=True)
        checks = stage.run(context)
        for check in checks:
            print(f"[gpu_check]   {'PASS' if check.passed else 'FAIL'} {check.name}: "
                  f"{check.detail}", flush=True)
        all_passed &= all(check.passed for check in checks)
        previous = None
        if os.path.exists(args.out):
            with open(args.out) as handle:
                previous = json.load(handle)
        environment = _environment(args.python)
        record = assemble_record(
            previous, device=environment["device"],
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            torch_version=environment["torch"], megatron_core=environment["megatron_core"],
            checks=checks, bench=context.bench)
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        with open(args.out, "w") as handle:
            json.dump(record, handle, indent=2)
            handle.write("\n")
    print(f"[gpu_check] {'all checks passed' if all_passed else 'some checks FAILED'}; "
          f"record: {args.out}")
    return 0 if all_passed else 1


if __name__ == "__main__":
    sys.exit(main())
