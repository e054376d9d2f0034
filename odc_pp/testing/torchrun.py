"""Run the training entry point (``torchrun -m odc_pp.train``) in a subprocess with a hard
timeout (the one torchrun launcher of the tests and benchmarks)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ENTRY = ["-m", "odc_pp.train"]
"""What torchrun runs by default: the training entry point, as a module (``torchrun -m``)."""

FAULTS = ["-m", "odc_pp.testing.faults"]
"""The training entry point with the tests' fault flags (:mod:`odc_pp.testing.faults`)."""

TINY_MODEL = ["--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4",
              "--seq-length", "48", "--mock-data", "--vocab-size", "48",
              "--global-batch-size", "8", "--micro-batch-size", "1", "--lr", "3e-2",
              "--lr-warmup-iters", "1", "--min-lr", "3e-3", "--seed", "7",
              "--no-progress-bar", "--distributed-timeout-minutes", "1.5",
              "--untie-embeddings-and-output-weights"]
"""The tiny GPT of the end-to-end tests, untied: their layouts are compared with a
single-process run within 1e-5 over 10 iterations at lr 3e-2, and a tied model's two
gradient sums (one weight at pp=1, two copies across stages) round differently, which that
learning rate amplifies past 1e-5 by iteration 8 (1e-7 at iteration 3). The tied default
is tested by test_megatron_tied.py and test_hf_training.py."""


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    log_path: str | None

    def records(self) -> list[dict]:
        """The training iterations' records (evaluations: :meth:`eval_records`)."""
        return [r for r in self._all_records() if "eval_loss" not in r]

    def eval_records(self) -> list[dict]:
        return [r for r in self._all_records() if "eval_loss" in r]

    def _all_records(self) -> list[dict]:
        with open(self.log_path) as handle:
            return [json.loads(line) for line in handle if line.strip()]

    def losses(self) -> list[float]:
        return [r["loss"] for r in self.records()]

    def describe(self) -> str:
        return f"exit {self.returncode}\n--- stdout\n{self.stdout[-3000:]}\n--- stderr\n" \
               f"{self.stderr[-6000:]}"


def start(flags: list[str], *, nproc: int, tmp_path, name: str, log: bool = True,
          script: str | None = None, torchrun: list[str] | None = None,
          env: dict | None = None,
          entry: list[str] | None = None) -> tuple[subprocess.Popen, str | None]:
    """Start torchrun (default ``--standalone``: a free rendezvous port; ``torchrun``
    replaces those launcher options) of ``script`` or ``entry`` (default: :data:`ENTRY`)
    in its own session; returns the process and the --log-json path."""
    log_path = str(tmp_path / f"{name}.jsonl") if log else None
    command = [sys.executable, "-m", "torch.distributed.run",
               *(torchrun if torchrun is not None else ["--standalone"]),
               "--nproc-per-node", str(nproc), *([script] if script else entry or ENTRY), *flags]
    if log_path:
        command += ["--log-json", log_path]
    environment = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT,
                       PYTHONWARNINGS="ignore", TORCHELASTIC_ERROR_FILE="", **(env or {}))
    process = subprocess.Popen(command, cwd=ROOT, env=environment, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    return process, log_path


def finish(process: subprocess.Popen, log_path: str | None, *, name: str,
           timeout: float = 240) -> Run:
    """Wait for a :func:`start`-ed torchrun; its process group is killed on timeout."""
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        raise AssertionError(f"{name}: torchrun did not finish within {timeout:.0f} s\n"
                             f"{stdout[-2000:]}\n{stderr[-4000:]}")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    return Run(process.returncode, stdout, stderr, log_path)


def launch(flags: list[str], *, nproc: int, tmp_path, name: str, timeout: float = 240,
           log: bool = True, script: str | None = None,
           entry: list[str] | None = None) -> Run:
    """torchrun --standalone (free rendezvous port) of ``script`` (default odc_pp.train);
    the process group is killed on timeout."""
    process, log_path = start(flags, nproc=nproc, tmp_path=tmp_path, name=name, log=log,
                              script=script, entry=entry)
    return finish(process, log_path, name=name, timeout=timeout)
