"""The measured timeline: a Chrome/Perfetto trace of what every rank ran, and the schedule
picture drawn from measured times.

Format: torch profiler's ``traceEvents`` JSON (Chrome trace event format), so the file
opens in https://ui.perfetto.dev and ``chrome://tracing`` next to a torch profiler trace.
One process track per rank (``pid`` = global rank), with threads:

* ``compute`` (tid 0): every F, B, W and fused BW, spanning the action's measured time
  (CUDA events on GPU, host clock on CPU: :class:`~odc_pp.runtime.timing.ActionClock`),
  including any wait for a peer's activation inside it (``args.waited_ms``);
* ``p2p`` (tid 1): explicit SEND/RECV actions;
* ``offload`` (tid 2): OFFLOAD/RELOAD;
* ``iteration`` (tid 3): the iteration's host-timed window and, after the last pipeline
  action, ``step + sync``: the optimizer step, data-parallel (ODC) synchronisation and
  the loss all-reduce.

Idle time is the gaps of the compute track inside the iteration window; its total per
rank and iteration is ``step_s - busy_s``, the training log's ``idle_s``. Timestamps are
microseconds since a barrier taken when tracing starts (``perf_counter`` per rank: one
clock per host, so ranks on different hosts are aligned to within the barrier's skew).
"""

from __future__ import annotations

import json
import os
from typing import Sequence

from ..schedule.ir import COMPUTE_KINDS, Action, ActionKind, Schedule
from ..schedule.simulator import SimResult

__all__ = ["TRACE_TIDS", "iteration_events", "metadata_events", "write_trace",
           "measured_result", "trace_idle"]

TRACE_TIDS = {"compute": 0, "p2p": 1, "offload": 2, "iteration": 3}
"""Thread ids of a rank's tracks."""

_TID_OF_KIND = {**{k: 0 for k in COMPUTE_KINDS},
                ActionKind.SEND_F: 1, ActionKind.SEND_B: 1, ActionKind.RECV_F: 1,
                ActionKind.RECV_B: 1, ActionKind.OFFLOAD: 2, ActionKind.RELOAD: 2}


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def _name(action: Action) -> str:
    return f"{action.kind.value} mb{action.microbatch} c{action.chunk}"


def metadata_events(rank: int, *, pp_rank: int, dp_rank: int) -> list[dict]:
    """Track names of ``rank`` (process and thread names, sorted by rank)."""
    events = [{"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
               "args": {"name": f"rank {rank} (pp {pp_rank}, dp {dp_rank})"}},
              {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
               "args": {"sort_index": rank}}]
    for name, tid in TRACE_TIDS.items():
        events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid,
                       "args": {"name": name}})
    return events


def iteration_events(rank: int, *, iteration: int, began_s: float, step_s: float,
                     minibatch_s: float, timings: Sequence) -> list[dict]:
    """Events of one iteration on ``rank``: the window ``[began_s, began_s + step_s]``
    (seconds on the trace clock), the pipeline actions ``timings`` (ActionTiming, seconds
    since the minibatch started at ``minibatch_s`` on the trace clock) in execution
    order, and the step/sync span after the last action."""
    window_end = began_s + step_s
    events = [{"ph": "X", "name": f"iteration {iteration}", "cat": "iteration",
               "pid": rank, "tid": TRACE_TIDS["iteration"], "ts": _us(began_s),
               "dur": _us(step_s), "args": {"iteration": iteration, "step_ms": step_s * 1e3}}]
    last_end = began_s
    for order, timing in enumerate(timings):
        action = timing.action
        tid = _TID_OF_KIND.get(action.kind)
        if tid is None:  # zero-time markers (POST_VALIDATION)
            continue
        start = min(max(minibatch_s + timing.start, began_s), window_end)
        end = min(max(minibatch_s + timing.end, start), window_end)
        last_end = max(last_end, end)
        args = {"iteration": iteration, "order": order, "microbatch": action.microbatch,
                "chunk": action.chunk, "waited_ms": round(timing.waited * 1e3, 6)}
        if action.peer is not None:
            args["peer"] = action.peer
        events.append({"ph": "X", "name": _name(action),
                       "cat": "compute" if tid == 0 else action.kind.value.lower(),
                       "pid": rank, "tid": tid, "ts": _us(start), "dur": _us(end - start),
                       "args": args})
    if window_end > last_end:
        events.append({"ph": "X", "name": "step + sync", "cat": "step", "pid": rank,
                       "tid": TRACE_TIDS["iteration"], "ts": _us(last_end),
                       "dur": _us(window_end - last_end),
                       "args": {"iteration": iteration,
                                "what": "optimizer step, data-parallel (ODC) sync, loss "
                                        "all-reduce"}})
    return events


def write_trace(path: str, events: list[dict], *, other: dict | None = None) -> str:
    """Write ``events`` as a ``traceEvents`` JSON file (atomically). Returns ``path``."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    temporary = f"{path}.tmp{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms",
                   "otherData": dict(other or {}, generator="odc-pp --trace")}, handle)
    os.replace(temporary, path)
    return path


def trace_idle(trace: dict) -> dict[tuple[int, int], float]:
    """Idle seconds per (rank, iteration) of a loaded trace: the iteration window minus
    the compute track's time inside it."""
    windows, busy = {}, {}
    for event in trace["traceEvents"]:
        if event.get("ph") != "X":
            continue
        key = (event["pid"], event["args"]["iteration"])
        if event.get("cat") == "iteration":
            windows[key] = event["dur"] / 1e6
        elif event["tid"] == TRACE_TIDS["compute"]:
            busy[key] = busy.get(key, 0.0) + event["dur"] / 1e6
    return {key: window - busy.get(key, 0.0) for key, window in windows.items()}


def measured_result(schedule: Schedule, rank_timings: Sequence[Sequence]) -> SimResult:
    """A :class:`SimResult` holding measured times (per pipeline rank, ActionTimings in
    seconds since a common origin) so :mod:`odc_pp.schedule.render` draws what ran.
    Memory fields are not measured here and stay empty."""
    actions, starts, ends = [], [], []
    for timings in rank_timings:
        actions.append([t.action for t in timings])
        starts.append([t.start for t in timings])
        ends.append([t.end for t in timings])
    busy, span, bubble = [], [], []
    for acts, s, e in zip(actions, starts, ends):
        compute = [(b, f) for a, b, f in zip(acts, s, e) if a.kind in COMPUTE_KINDS]
        work = sum(f - b for b, f in compute)
        width = (max(f for _, f in compute) - min(b for b, _ in compute)) if compute else 0.0
        busy.append(work)
        span.append(width)
        bubble.append(1 - work / width if width > 0 else 0.0)
    first = min((s[0] for s in starts if s), default=0.0)
    last = max((max(e) for e in ends if e), default=0.0)
    longest = max(span, default=0.0)
    return SimResult(makespan=last - first, max_stage_span=longest,
                     bubble_rate=(longest - max(busy, default=0.0)) / longest if longest else 0.0,
                     per_rank_bubble=bubble, busy=busy, span=span,
                     peak_activation=[0.0] * len(actions),
                     memory_timeline=[[] for _ in actions], rank_actions=actions,
                     rank_starts=starts, rank_ends=ends)
