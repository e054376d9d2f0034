"""Action timings in device time: :class:`ActionClock`.

On CPU a mark is the host clock (``time.perf_counter``) when it is taken. On CUDA a mark
is a timing event recorded on a stream (the current one unless given), and
:meth:`ActionClock.resolve` turns marks into seconds since :meth:`ActionClock.restart`
with ``cudaEventElapsedTime``: an action's span then covers the kernels it queued, not
the host's launch time. Resolving waits for the last mark's event (one host sync per
minibatch, after its last action). The timings feed the profiler's cost model (ZB-auto
re-planning), the offload bandwidth and the training log's busy/idle figures.
"""

from __future__ import annotations

import dataclasses
import time

import torch

__all__ = ["ActionClock"]


class ActionClock:
    """Marks and spans of one minibatch on ``device`` (see the module docstring)."""

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.uses_events = self.device.type == "cuda"
        self._origin = None
        self.restart()

    def restart(self) -> None:
        """Time zero of the next minibatch (recorded on the current stream on CUDA)."""
        self._origin = self.mark()

    def mark(self, stream=None):
        """A point in time: a float (CPU) or a CUDA timing event recorded on ``stream``
        (default: the current stream of the device)."""
        if not self.uses_events:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(stream if stream is not None else torch.cuda.current_stream(self.device))
        return event

    def seconds(self, mark) -> float:
        """Seconds from the origin to ``mark`` (its event must have completed)."""
        if not self.uses_events:
            return mark - self._origin
        return self._origin.elapsed_time(mark) / 1000.0

    def elapsed(self, begin, end) -> float:
        """Seconds between two marks (CUDA: waits for ``end``'s event)."""
        if not self.uses_events:
            return end - begin
        end.synchronize()
        return begin.elapsed_time(end) / 1000.0

    def resolve(self, timings: list) -> list:
        """``timings`` (dataclasses with ``start``/``end`` marks) with both replaced by
        seconds since the origin. On CUDA, waits for every mark's event first."""
        if not self.uses_events:
            return [dataclasses.replace(t, start=t.start - self._origin, end=t.end - self._origin)
                    for t in timings]
        for timing in timings:  # side-stream marks may finish after the last current one
            timing.end.synchronize()
        return [dataclasses.replace(t, start=self.seconds(t.start), end=self.seconds(t.end))
                for t in timings]
