#!/usr/bin/env python3
"""The one-call GPU command (issue 50, item 5): on a fresh lent machine, within
``--budget-s`` (default 400 s, so that two calls fit a 15-minute device budget with the
machine's start), in order:

* ``wheels``: megatron-core, pybind11, Liger and cut-cross-entropy from ``.whl/``
  (``pip install --no-index --no-deps``; ``tools/prepare_wheels.py`` fills the folder);
* ``build``: ``setup.py build_ext --inplace`` for the device's own architecture with the
  CUDA backend required (``ODC_PP_NO_CUDA=0``: a build without it fails);
* ``pytest-gpu``: ``pytest -m gpu tests`` (the sync-free step test included);
* ``cross-entropy``: ``benchmarks/bench_cross_entropy.py`` at the real shape;
* ``step``: ``benchmarks/bench_gpu_step.py`` (full rows, packed, Hugging Face) with what
  is left, writing the record with its ``verdicts``.

Each phase prints its cap and the time left and gets at most ``min(cap, left)``; a phase
whose minimum no longer fits, or whose prerequisite failed, is skipped and recorded so.
``OUT/oneshot.json`` (rewritten after every phase) holds each phase's status, seconds and
log tail; ``OUT/logs.tgz`` every log (phases and the step's); with ``cross_entropy.json``,
``gpu_step.json`` and the caller's ``console.txt``, five files come back. See docs/gpu.md for the call.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_BUDGET_S = 400.0
STEP_RUNS = ("full-1f1b", "lbmini-packed", "hf")
"""The step's runs, most wanted first (bench_gpu_step.py skips those that no longer fit)."""


@dataclass(frozen=True, kw_only=True)
class Phase:
    """One phase of the call."""

    name: str
    """Its name in the console and the record."""
    cap_s: float
    """The most seconds it may run."""
    min_s: float
    """It is skipped when fewer seconds than this are left."""
    needs: tuple[str, ...] = ()
    """Phases that must have passed first."""
    command: Callable[[argparse.Namespace, float], list[str]] = field(repr=False)
    """Its command, given the arguments and the seconds it may run."""
    env: dict = field(default_factory=dict)
    """Extra environment."""


def _python(args) -> str:
    return args.python


def _wheels(args, _):
    return [_python(args), "-m", "pip", "install", "-q", "--no-index", "--no-deps",
            "--find-links", os.path.join(ROOT, ".whl"), "megatron-core", "pybind11",
            "liger-kernel", "cut-cross-entropy"]


def _build(args, _):
    return [_python(args), "setup.py", "build_ext", "--inplace"]


def _pytest(args, _):
    return [_python(args), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu",
            "-rfEs", "tests"]


def _cross_entropy(args, _):
    return [_python(args), "benchmarks/bench_cross_entropy.py", "--iters", "5",
            "--json", os.path.join(args.out, "cross_entropy.json")]


def _step(args, seconds):
    runs = [flag for name in STEP_RUNS for flag in ("--run", name)]
    return [_python(args), "benchmarks/bench_gpu_step.py", "--out",
            os.path.join(args.out, "gpu_step.json"), "--work", args.work, "--no-dry-run",
            "--iters", "5", "--budget-s", f"{max(seconds - 10, 20):.0f}", *runs]


PHASES = (
    Phase(name="wheels", cap_s=60, min_s=15, command=_wheels),
    Phase(name="build", cap_s=100, min_s=45, needs=("wheels",), command=_build,
          env={"ODC_PP_NO_CUDA": "0"}),
    Phase(name="pytest-gpu", cap_s=150, min_s=60, needs=("build",), command=_pytest),
    Phase(name="cross-entropy", cap_s=60, min_s=25, needs=("wheels",),
          command=_cross_entropy),
    Phase(name="step", cap_s=300, min_s=70, needs=("build",), command=_step),
)
"""The call's phases, in order."""


def _run(command: list[str], timeout_s: float, log_path: str, env: dict) -> int:
    """Run ``command`` in its own process group (killed whole on timeout); 124: timed out."""
    with open(log_path, "w") as log:
        log.write(f"$ {' '.join(command)}\n")
        log.flush()
        process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                   env={**os.environ, **env}, start_new_session=True)
        try:
            return process.wait(timeout=max(timeout_s, 1))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            log.write(f"\nTIMEOUT after {timeout_s:.0f} s\n")
            return 124


def _tail(path: str, lines: int = 15) -> str:
    with open(path, errors="replace") as handle:
        return "".join(handle.readlines()[-lines:])[-2000:]


def run_phases(args, phases=PHASES, *, runner=_run, clock=time.monotonic,
               say=print) -> dict:
    """Every phase within ``args.budget_s``; the record (also written to
    ``OUT/oneshot.json`` after each phase)."""
    started = clock()
    record = {"budget_s": args.budget_s, "phases": {}}
    logs = args.logs
    os.makedirs(logs, exist_ok=True)
    for phase in phases:
        elapsed = clock() - started
        left = args.budget_s - elapsed
        failed = [need for need in phase.needs
                  if record["phases"].get(need, {}).get("status") != "passed"]
        if failed:
            entry = {"status": "skipped", "why": f"needs {', '.join(failed)}"}
        elif left < phase.min_s:
            entry = {"status": "skipped",
                     "why": f"budget spent: {left:.0f} s left, needs {phase.min_s:.0f}"}
        else:
            seconds = min(phase.cap_s, left)
            say(f"[{elapsed:4.0f}s] {phase.name}: up to {seconds:.0f} s "
                f"(cap {phase.cap_s:.0f}, {left:.0f} s left of {args.budget_s:.0f})")
            log = os.path.join(logs, f"{phase.name}.log")
            status = runner(phase.command(args, seconds), seconds, log,
                            {**phase.env, **_extra_env(phase)})
            entry = {"status": "passed" if status == 0 else "failed", "exit": status,
                     "seconds": round(clock() - started - elapsed, 1),
                     "cap_s": seconds, "tail": _tail(log) if os.path.exists(log) else ""}
        if entry["status"] == "skipped":
            say(f"[{elapsed:4.0f}s] {phase.name}: skipped ({entry['why']})")
        else:
            say(f"[{clock() - started:4.0f}s] {phase.name}: {entry['status']} "
                f"in {entry['seconds']:.0f} s")
        record["phases"][phase.name] = entry
        record["elapsed_s"] = round(clock() - started, 1)
        with open(os.path.join(args.out, "oneshot.json"), "w") as handle:
            json.dump(record, handle, indent=1)
    return record


def _extra_env(phase: Phase) -> dict:
    """The build's architecture: the device's own compute capability, unless set."""
    if phase.name != "build" or os.environ.get("ODC_PP_CUDA_ARCHS"):
        return {}
    try:
        import torch
        return {"ODC_PP_CUDA_ARCHS": "%d%d" % torch.cuda.get_device_capability(0)}
    except Exception:  # noqa: BLE001 - setup.py's default architectures then
        return {}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the folder the results go to ($OUT)")
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                        help="seconds for every phase together")
    parser.add_argument("--work", default="/tmp/gpu_step", help="the step's logs and rows")
    parser.add_argument("--logs", default="/tmp/gpu_oneshot_logs",
                        help="each phase's log (outside --out: at most 8 files come back)")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--skip", action="append", default=[], choices=[p.name for p in PHASES],
                        help="leave a phase out (repeatable)")
    args = parser.parse_args(argv)
    import torch
    if not torch.cuda.is_available():  # it installs into --python and builds for the GPU
        print("gpu_oneshot: no CUDA device: this command is for the lent GPU machine "
              "(docs/gpu.md)", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    record = run_phases(args, [p for p in PHASES if p.name not in args.skip])
    with tarfile.open(os.path.join(args.out, "logs.tgz"), "w:gz") as archive:
        archive.add(args.logs, arcname="phases")
        if os.path.isdir(args.work):
            archive.add(args.work, arcname="step",
                        filter=lambda info: None if info.name.endswith("rows.jsonl") else info)
    statuses = [entry["status"] for entry in record["phases"].values()]
    print(f"gpu_oneshot: {statuses.count('passed')} passed, {statuses.count('failed')} "
          f"failed, {statuses.count('skipped')} skipped in {record['elapsed_s']:.0f} s")
    return 1 if "failed" in statuses else 0


if __name__ == "__main__":
    sys.exit(main())
