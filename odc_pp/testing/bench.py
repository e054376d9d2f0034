"""What every timed benchmark records and how it writes its result (issue 22's timing
rules: 2 ranks with 1 thread each on this machine, configurations alternating round by
round, the median with min-max over >= 3 rounds, and the load average next to them)."""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Sequence

__all__ = ["load_1min", "spread", "rotated", "emit", "cuda_event_ms"]


def load_1min() -> float:
    """The machine's 1-minute load average, rounded (recorded before each timed run)."""
    return round(os.getloadavg()[0], 2)


def spread(values: Sequence[float], digits: int = 4) -> dict:
    """Median with min and max, and the values themselves."""
    return {"median": round(statistics.median(values), digits),
            "min": round(min(values), digits), "max": round(max(values), digits),
            "rounds": [round(v, digits) for v in values]}


def rotated(items: Sequence, round_index: int) -> list:
    """``items`` starting at ``round_index`` (mod len): a round's order, so no
    configuration always runs first or last."""
    shift = round_index % len(items)
    return list(items[shift:]) + list(items[:shift])


def emit(doc: dict, *, out: str | None, as_json: bool) -> str:
    """Write ``doc`` as JSON to ``out`` (if given; folders are created) and print it with
    ``as_json``; returns the text."""
    text = json.dumps(doc, indent=1)
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")
    if as_json:
        print(text)
    return text


def cuda_event_ms(run, repeats: int) -> list[float]:
    """Milliseconds of each of ``repeats`` calls of ``run()``, timed by CUDA events on the
    current stream (never the host clock): the kernels it queued, the end event waited
    for before the next call."""
    import torch

    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times
