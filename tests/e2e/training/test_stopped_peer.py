"""A stopped peer is named within the job's timeout in every layout family (issue 53,
item 2): rank 1 stops itself (SIGSTOP) at the start of its second iteration; within twice
``--distributed-timeout-minutes`` of the stop rank 0 must fail with a message naming rank
1 as the rank that stopped responding, and the job must then exit non-zero (the launcher
ends the stopped rank). Before every group got the job's timeout, the cp and collective
layouts waited for torch's default 30 minutes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time

import pytest

from odc_pp.testing.torchrun import FAULTS, TINY_MODEL, start

TIMEOUT_MINUTES = 0.1
"""--distributed-timeout-minutes of the runs: 6 s."""
TIMEOUT_S = TIMEOUT_MINUTES * 60
SLACK_S = 4.0
"""What the failing rank may take beyond twice the timeout to print its error, on a
loaded machine."""
EXIT_S = 30.0
"""How long the launcher may take to end the job after that (the zygote's SIGTERM, then
SIGKILL 10 s later, for the stopped rank)."""
START_LIMIT_S = 240.0
"""How long the job may take to reach the stop."""

LAYOUTS = {
    "pp2": ["--pipeline-model-parallel-size", "2"],
    "dp2_odc": ["--dp-mode", "odc"],
    "dp2_collective": ["--dp-mode", "collective"],
    "dp2_hierarchical": ["--dp-mode", "hierarchical", "--dp-ranks-per-host", "1"],
    "cp2": ["--context-parallel-size", "2"],
    "tp2": ["--tensor-model-parallel-size", "2"],
}
"""Two ranks of each layout family."""

_STOPPED = re.compile(r"rank 1: injected fault at iteration 2 \(SIGSTOP, pid (\d+)\)")
_NAMED = re.compile(r"rank 0 failed: TimeoutError: rank 0: .*: rank 1 \([^)]*\) stopped "
                    r"responding \(last heartbeat [0-9.]+ s ago\)")


class _Lines:
    """A pipe's lines as they come, with the time the stop was announced."""

    def __init__(self, pipe) -> None:
        self.lines: list[str] = []
        self.stopped_at: float | None = None
        self.stopped_pid: int | None = None
        self.named_at: float | None = None
        self.named: str = ""
        self.thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self.thread.start()

    def _read(self, pipe) -> None:
        for line in pipe:
            match = _STOPPED.search(line)
            if match and self.stopped_at is None:
                self.stopped_at = time.monotonic()
                self.stopped_pid = int(match.group(1))
            if _NAMED.search(line) and self.named_at is None:
                self.named_at, self.named = time.monotonic(), line.strip()
            self.lines.append(line)

    def text(self) -> str:
        return "".join(self.lines)


def _wait_for(condition, limit_s: float) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def _end(process: subprocess.Popen, pid: int | None) -> None:
    """The launcher's session and the stopped rank (which a stopped process keeps)."""
    if pid is not None:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_stopped_peer_is_named_within_the_timeout(tmp_path, layout):
    flags = [*TINY_MODEL, *LAYOUTS[layout], "--train-iters", "4",
             "--distributed-timeout-minutes", str(TIMEOUT_MINUTES),
             "--inject-fault-rank", "1", "--inject-fault-iter", "2",
             "--inject-fault-signal", "STOP"]
    process, _ = start(flags, nproc=2, tmp_path=tmp_path, name=layout, log=False,
                       entry=FAULTS)
    out, err = _Lines(process.stdout), _Lines(process.stderr)
    try:
        assert _wait_for(lambda: err.stopped_at is not None or process.poll() is not None,
                         START_LIMIT_S), f"{layout}: rank 1 never stopped\n{err.text()}"
        assert err.stopped_at is not None, f"{layout}: exited before the stop\n{err.text()}"
        limit_s = 2 * TIMEOUT_S + SLACK_S
        _wait_for(lambda: err.named_at is not None or process.poll() is not None,
                  limit_s - (time.monotonic() - err.stopped_at))
        exited = _wait_for(lambda: process.poll() is not None, EXIT_S)
    finally:
        _end(process, err.stopped_pid)
    out.thread.join(5)
    err.thread.join(5)
    text = out.text() + err.text()
    assert err.named_at is not None, \
        f"{layout}: rank 1 not named as stopped within {limit_s:g} s\n{text[-4000:]}"
    took = err.named_at - err.stopped_at
    print(f"{layout}: rank 1 named {took:.1f} s after it stopped: {err.named}")
    assert took <= limit_s, f"{layout}: named only after {took:.1f} s\n{text[-4000:]}"
    assert exited and process.returncode != 0, f"{layout}: no failed exit\n{text[-4000:]}"
