"""A stopped peer is named within the job's timeout in every layout family (issue 53,
item 2): rank 1 stops itself (SIGSTOP) at the start of its second iteration, and the job
must exit non-zero within twice ``--distributed-timeout-minutes`` of the stop, with a
message naming rank 1."""

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
SLACK_S = 8.0
"""What the failing rank may take beyond twice the timeout to report and leave (its
exit, torchrun's or the zygote's reaction) on a loaded machine."""
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


class _Lines:
    """A pipe's lines as they come, with the time the stop was announced."""

    def __init__(self, pipe) -> None:
        self.lines: list[str] = []
        self.stopped_at: float | None = None
        self.stopped_pid: int | None = None
        self.thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self.thread.start()

    def _read(self, pipe) -> None:
        for line in pipe:
            match = _STOPPED.search(line)
            if match and self.stopped_at is None:
                self.stopped_at = time.monotonic()
                self.stopped_pid = int(match.group(1))
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
        exited = _wait_for(lambda: process.poll() is not None,
                           limit_s - (time.monotonic() - err.stopped_at))
        took = time.monotonic() - err.stopped_at
    finally:
        _end(process, err.stopped_pid)
    out.thread.join(5)
    err.thread.join(5)
    text = out.text() + err.text()
    assert exited, f"{layout}: no exit {took:.0f} s after rank 1 stopped\n{text[-4000:]}"
    print(f"{layout}: failed {took:.1f} s after the stop")
    assert process.returncode != 0, text[-4000:]
    named = re.search(r"rank 1\b[^\n]*stopped responding", text)
    assert named, f"{layout}: no message names rank 1 ({took:.1f} s)\n{text[-4000:]}"
