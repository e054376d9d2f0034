"""``--trace FILE``: every rank's measured iterations as one Chrome/Perfetto trace
(:mod:`odc_pp.runtime.trace`), gathered on rank 0 at the end of training, and the
schedule picture of data-parallel replica 0's last iteration drawn from measured times
(``FILE`` with ``.png``)."""

from __future__ import annotations

import dataclasses
import os
import time

import torch.distributed as dist

from odc_pp.runtime.trace import (iteration_events, measured_result, metadata_events,
                                  write_trace)

__all__ = ["TraceRecorder"]


class TraceRecorder:
    """Collects this rank's trace events; :meth:`close` (collective) writes the file."""

    def __init__(self, path: str, topo) -> None:
        self.path = path
        self.topo = topo
        dist.barrier()  # a common time zero for every rank's track
        self.zero = time.perf_counter()
        self.events = metadata_events(topo.rank, pp_rank=topo.pp_rank, dp_rank=topo.dp_rank)
        self.last: list = []

    def record(self, iteration: int, began: float, step_s: float, result) -> None:
        """One iteration: ``began`` (perf_counter) and ``step_s`` are the training loop's
        (the log's step time), ``result`` its IterationResult."""
        minibatch = result.minibatch
        minibatch_s = result.minibatch_started - self.zero
        self.events += iteration_events(self.topo.rank, iteration=iteration,
                                        began_s=began - self.zero, step_s=step_s,
                                        minibatch_s=minibatch_s, timings=minibatch.timings)
        self.last = [dataclasses.replace(t, start=t.start + minibatch_s, end=t.end + minibatch_s)
                     for t in minibatch.timings]

    def close(self, schedule, *, out=None) -> None:
        """Gather every rank's events on rank 0 and write the trace and the picture."""
        mine = (self.topo.pp_rank, self.topo.dp_rank, self.events, self.last)
        gathered = [None] * self.topo.world_size if self.topo.rank == 0 else None
        dist.gather_object(mine, gathered, dst=0)
        if self.topo.rank != 0:
            return
        events = [event for part in gathered for event in part[2]]
        write_trace(self.path, events, other={"world_size": self.topo.world_size,
                                              "pp": self.topo.pp, "dp": self.topo.dp})
        replica = sorted((part for part in gathered if part[1] == 0), key=lambda p: p[0])
        picture = f"{os.path.splitext(self.path)[0]}.png"
        try:
            from odc_pp.schedule.render import render_png

            render_png(schedule, measured_result(schedule, [p[3] for p in replica]), picture)
        except ImportError:  # matplotlib missing: the trace alone
            picture = None
        if out is not None:
            print(f"trace: {self.path}" + (f"; measured schedule picture: {picture}"
                                           if picture else ""), file=out, flush=True)
