"""Run the training entry point (``torchrun -m odc_pp.train``) in a subprocess with a hard
timeout (the one torchrun launcher of the tests and benchmarks).

Two launchers, one interface. ``launcher="zygote"`` (the tests' default) is
:mod:`odc_pp.testing.zygote`: torchrun's worker environment, with the ranks forked from one
process that imported torch and megatron-core once per test session
(:mod:`odc_pp.testing.zygote_server`; a tiny run's time was mostly those imports).
``launcher="torchrun"`` is ``python -m torch.distributed.run`` itself: the tests of
launcher behaviour (restarts, signals, torchelastic's failure report and error files) and
the benchmarks use it, and any ``torchrun=`` options imply it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
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


_ZYGOTE_FAILURE = re.compile(r"odc_pp\.testing\.zygote: rank (\d+) \(pid \d+\) exited with "
                             r"code (-?\d+)")
_TORCHRUN_FAILURE = re.compile(r"rank\s+: (\d+) \(local_rank: \d+\)\s+exitcode\s+: (-?\d+) "
                               r"\(pid")
LAUNCHERS = ("zygote", "torchrun")
"""What :func:`start` can launch through (module docstring)."""


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

    def exit_codes(self) -> dict[int, int]:
        """The failed ranks' exit statuses (rank -> status; a signal is negative), from
        torchrun's failure report or the zygote's lines on stderr; empty when none
        failed."""
        codes = {int(rank): int(code) for rank, code in _ZYGOTE_FAILURE.findall(self.stderr)}
        for rank, code in _TORCHRUN_FAILURE.findall(self.stderr):
            codes.setdefault(int(rank), int(code))
        return codes

    def describe(self) -> str:
        return f"exit {self.returncode}\n--- stdout\n{self.stdout[-3000:]}\n--- stderr\n" \
               f"{self.stderr[-6000:]}"


_SERVER: list = []
"""The zygote server of this process (started by the first zygote launch) and its socket
directory."""


def _zygote_server(environment: dict[str, str]) -> str:
    """The socket of this process's :mod:`odc_pp.testing.zygote_server`, started once with
    ``environment`` (it imports torch and megatron-core under it); it ends with this
    process (its stdin closes)."""
    if _SERVER and _SERVER[0].poll() is None:
        return os.path.join(_SERVER[1].name, "zygote.sock")
    _SERVER.clear()
    directory = tempfile.TemporaryDirectory(prefix="odc-pp-zygote-")
    if len(directory.name) > 80 and os.path.isdir("/tmp"):  # a Unix socket's path: < 108 B
        directory.cleanup()
        directory = tempfile.TemporaryDirectory(prefix="odc-pp-zygote-", dir="/tmp")
    path = os.path.join(directory.name, "zygote.sock")
    server = subprocess.Popen([sys.executable, "-m", "odc_pp.testing.zygote_server", "serve",
                               path],
                              cwd=ROOT, env=environment, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    ready = server.stdout.readline()  # (after the imports: seconds)
    if ready.strip() != "ready":
        server.kill()
        raise RuntimeError(f"odc_pp.testing.zygote_server did not start: {ready!r}, exit "
                           f"{server.wait()}")
    _SERVER.extend([server, directory])
    return path


def start(flags: list[str], *, nproc: int, tmp_path, name: str, log: bool = True,
          script: str | None = None, torchrun: list[str] | None = None,
          env: dict | None = None, entry: list[str] | None = None,
          launcher: str = "zygote") -> tuple[subprocess.Popen, str | None]:
    """Start ``script`` or ``entry`` (default: :data:`ENTRY`) on ``nproc`` ranks in its own
    session, through ``launcher`` (module docstring; torchrun's options default to
    ``--standalone``: a free rendezvous port); returns the process and the --log-json
    path."""
    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher must be one of {LAUNCHERS}, got {launcher!r}")
    log_path = str(tmp_path / f"{name}.jsonl") if log else None
    if torchrun is not None or launcher == "torchrun":
        prefix = ["-m", "torch.distributed.run",
                  *(torchrun if torchrun is not None else ["--standalone"])]
    environment = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT,
                       PYTHONWARNINGS="ignore", TORCHELASTIC_ERROR_FILE="", **(env or {}))
    if torchrun is None and launcher == "zygote":
        prefix = ["-m", "odc_pp.testing.zygote_server", "launch", _zygote_server(environment)]
    command = [sys.executable, *prefix, "--nproc-per-node", str(nproc),
               *([script] if script else entry or ENTRY), *flags]
    if log_path:
        command += ["--log-json", log_path]
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
           log: bool = True, script: str | None = None, entry: list[str] | None = None,
           launcher: str = "zygote") -> Run:
    """:func:`start` and :func:`finish`: ``script`` (default odc_pp.train) on ``nproc``
    ranks; the process group is killed on timeout."""
    process, log_path = start(flags, nproc=nproc, tmp_path=tmp_path, name=name, log=log,
                              script=script, entry=entry, launcher=launcher)
    return finish(process, log_path, name=name, timeout=timeout)
