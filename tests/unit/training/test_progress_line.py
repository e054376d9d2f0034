"""The progress of training (iterations done, rate, ETA) in the log: a bar redrawn on a
terminal, and on every logged line when the log is a file or a pipe."""

from __future__ import annotations

import io

from odc_pp.training.logging_utils import TrainingLogger, format_duration

_RECORD = {"loss": 2.0, "lr": 1e-3, "grad_norm": 0.5, "tokens_per_s": 100.0, "step_s": 0.5}


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _run(stream, *, iters=(1, 2, 3, 4), log_every=2, first=1, **kw):
    clock = _Clock()
    logger = TrainingLogger(train_iters=10, stream=stream, clock=clock, **kw)
    for i in range(first, first + len(iters)):
        clock.now += 0.5  # 2 iterations per second
        logger.progress(i)
        if i % log_every == 0:
            logger.log({"iteration": i, **_RECORD})
    logger.close()
    return stream.getvalue()


def test_logged_lines_carry_rate_and_eta_off_a_terminal():
    lines = _run(io.StringIO()).splitlines()
    assert len(lines) == 2  # one per --log-interval, no bar redraws in a file
    assert lines[0].endswith("| 2/10 (20%) | 2 it/s | elapsed 1s | ETA 4s"), lines[0]
    assert lines[1].endswith("| 4/10 (40%) | 2 it/s | elapsed 2s | ETA 3s"), lines[1]
    assert "\r" not in "".join(lines)


def test_resumed_run_counts_its_own_iterations():
    """A run resumed at iteration 6 measures its rate over its own iterations."""
    lines = _run(io.StringIO(), first=7).splitlines()
    assert lines[0].endswith("| 8/10 (80%) | 2 it/s | elapsed 1s | ETA 1s"), lines


def test_terminal_bar_shows_rate_and_eta_and_lines_stay_plain():
    text = _run(_Terminal())
    assert "\r\033[K[######........................] 2/10 (20%) | 2 it/s" in text
    assert "ETA 3s" in text
    logged = [line.split("\r")[-1] for line in text.split("\n") if "loss" in line]
    assert logged and all("it/s" not in line.split("\033[K")[-1] for line in logged)


def test_no_progress_bar_means_plain_lines():
    text = _run(io.StringIO(), progress_bar=False)
    assert "it/s" not in text and "ETA" not in text and len(text.splitlines()) == 2


def test_durations():
    assert [format_duration(s) for s in (0, 42.4, 185, 7620)] == ["0s", "42s", "3m05s",
                                                                   "2h07m"]
