"""Measure T_F, T_B, T_W, T_comm, offload time and saved bytes per stage; re-plan ZB-auto.

Feed :meth:`Profiler.record` the :class:`MinibatchResult` of the first minibatches (the
first ``warmup_minibatches`` are ignored: allocator and first-touch effects), call
:meth:`measure_comm` once on every pipeline rank, then :meth:`cost_model` (collective
over the pipeline group) gives a :class:`~odc_pp.schedule.costs.CostModel` with one
entry per virtual stage, in seconds (``offload_bandwidth`` = 1 / the slowest rank's mean
OFFLOAD/RELOAD time when the schedule has them), and :meth:`replan` builds and lowers a schedule
(ZB-auto by default) from it.

Explicit SEND/RECV actions also cost their rank CPU time (gloo issues a send on the
caller's thread and contends with its I/O thread): the mean blocking time per SEND (a
batch's time shared by its sends) and per RECV post becomes ``t_send_cpu`` /
``t_recv_cpu``, which the simulator charges to the rank.

Timings are device time on GPU: the runtime's action timings and the T_comm ping-pong come
from CUDA events (:class:`~odc_pp.runtime.timing.ActionClock`), host clocks only on CPU.

Profile with a schedule that splits B and W (e.g. zb-h1) to measure both; from fused BW
actions alone the split is unknown and T_B = T_W = T_BW / 2 is assumed.

Sample costs for sample assignment: with the microbatches passed to :meth:`Profiler.record`,
each microbatch's compute time on this rank (F + B + W over its chunks) is kept with the
positions it executed (``linear`` = rows x row length, ``quadratic`` = rows x row length^2:
padded rows and packed rows alike), and :meth:`Profiler.sample_cost_model` fits the
measured seconds per token and per token^2
(:func:`~odc_pp.data.load_balance.fit_microbatch_costs`) that ``--sample-cost-model``
feeds every load-balance mode. On pp = 1 that is the whole model's cost; on pp > 1 this
stage's share.

Memory deltas (``CostModel.mem_f/mem_b/mem_w``, in microbatch-chunk units) come from the
bytes each F saves (``activation_bytes``) and the bytes each B leaves held for its W
(``wgrad_bytes``): per stage ``r = held / saved``, F adds 1, B ``r - 1`` and W ``-r``
(the zero-bubble paper's model, with r measured). The model takes one set of deltas: the
largest r over the stages (the most W can hold), clamped to [0, 1]; without both byte
counts the defaults (1, 0, -1) stay.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..data.load_balance import FittedCost, fit_microbatch_costs
from ..schedule.costs import CostModel
from ..schedule.ir import ActionKind, Schedule
from .runtime import MinibatchResult
from .timing import ActionClock

__all__ = ["ProfilerConfig", "Profiler", "merge_measurements", "memory_deltas"]


@dataclass(kw_only=True)
class ProfilerConfig:
    """What the profiler measures."""

    warmup_minibatches: int = 1
    """Recorded minibatches to ignore before measuring."""
    comm_repeats: int = 5
    """Round trips per neighbour pair when measuring T_comm."""

    def __post_init__(self) -> None:
        if self.warmup_minibatches < 0 or self.comm_repeats < 1:
            raise ValueError("warmup_minibatches must be >= 0 and comm_repeats >= 1")


class Profiler:
    """Per-stage cost measurements of one pipeline rank (see module docstring)."""

    def __init__(self, config: ProfilerConfig, *, schedule: Schedule, pp_group) -> None:
        self.config = config
        self.schedule = schedule
        self.pp_group = pp_group
        self.rank = dist.get_rank(pp_group)
        self._seen = 0
        self._durations: dict[tuple[ActionKind, int], list[float]] = defaultdict(list)
        self._bytes: dict[int, list[int]] = defaultdict(list)
        self._wgrad_bytes: dict[int, list[int]] = defaultdict(list)
        self._transfers: list[float] = []
        self._message_cpu: dict[str, list[float]] = {"send": [], "recv": []}
        self.t_comm: float | None = None
        self._sample_points: list[tuple[float, float, float]] = []

    def record(self, result: MinibatchResult, microbatches=None) -> None:
        """Keep ``result``'s timings (past the warm-up); with ``microbatches`` (the list run,
        each with ``tokens [rows, length]``) also each microbatch's compute seconds for
        :meth:`sample_cost_model`."""
        self._seen += 1
        if self._seen <= self.config.warmup_minibatches:
            return
        if microbatches is not None:
            self._record_samples(result, microbatches)
        for timing in result.timings:
            if timing.action.is_compute:
                stage = self.schedule.stage_of(self.rank, timing.action.chunk)
                self._durations[(timing.action.kind, stage)].append(timing.busy)
            elif timing.action.kind in (ActionKind.OFFLOAD, ActionKind.RELOAD):
                self._transfers.append(timing.busy)
        self._record_messages(result)
        for (chunk, _), nbytes in result.activation_bytes.items():
            self._bytes[self.schedule.stage_of(self.rank, chunk)].append(nbytes)
        for (chunk, _), nbytes in getattr(result, "wgrad_bytes", {}).items():
            self._wgrad_bytes[self.schedule.stage_of(self.rank, chunk)].append(nbytes)

    def _record_samples(self, result: MinibatchResult, microbatches) -> None:
        seconds: dict[int, float] = defaultdict(float)
        for timing in result.timings:
            if timing.action.is_compute:
                seconds[timing.action.microbatch] += timing.busy
        for index, microbatch in enumerate(microbatches):
            if index in seconds:
                rows, length = (int(v) for v in microbatch.tokens.shape)
                self._sample_points.append((rows * length, rows * length * length,
                                            seconds[index]))

    def sample_cost_model(self) -> FittedCost:
        """Measured seconds per token, per token^2 and per microbatch row (``c``) of this
        rank's microbatches (needs
        ``record(..., microbatches)`` with at least two different shapes)."""
        if len({(lin, quad) for lin, quad, _ in self._sample_points}) < 3:
            raise ValueError("the sample cost fit needs microbatches of at least three "
                             "different shapes recorded past the warm-up")
        linear, quadratic, times = zip(*self._sample_points)
        return fit_microbatch_costs(linear, quadratic, times, with_constant=True)

    def _record_messages(self, result: MinibatchResult) -> None:
        """Per-message CPU time of SEND (a batch's busy time split over its sends) and
        RECV actions."""
        send_batches: dict[tuple[float, float], list] = defaultdict(list)
        for timing in result.timings:
            if timing.action.kind in (ActionKind.SEND_F, ActionKind.SEND_B):
                send_batches[(timing.start, timing.end)].append(timing)
            elif timing.action.kind in (ActionKind.RECV_F, ActionKind.RECV_B):
                self._message_cpu["recv"].append(timing.busy)
        for batch in send_batches.values():
            self._message_cpu["send"] += [batch[0].busy / len(batch)] * len(batch)

    def measure_comm(self, sample: torch.Tensor) -> float:
        """Half the round trip of ``sample`` between neighbouring ranks (collective)."""
        pp = dist.get_world_size(self.pp_group)
        times = []
        for parity in (0, 1):  # pairs (0,1), (2,3) ... then (1,2), (3,4) ...
            partner = self.rank + 1 if self.rank % 2 == parity else self.rank - 1
            if 0 <= partner < pp:
                times += self._ping_pong(sample, partner)
            dist.barrier(group=self.pp_group)
        self.t_comm = statistics.median(times) if times else 0.0
        return self.t_comm

    def _ping_pong(self, sample: torch.Tensor, partner: int) -> list[float]:
        peer = dist.get_global_rank(self.pp_group, partner)
        buffer = torch.empty_like(sample)
        clock = ActionClock(sample.device)  # CUDA: events around the stream-ordered messages
        times = []
        for _ in range(self.config.comm_repeats):
            start = clock.mark()
            if self.rank < partner:
                dist.send(sample, peer, group=self.pp_group)
                dist.recv(buffer, peer, group=self.pp_group)
            else:
                dist.recv(buffer, peer, group=self.pp_group)
                dist.send(sample, peer, group=self.pp_group)
            times.append(clock.elapsed(start, clock.mark()) / 2)
        return times

    def local_costs(self) -> dict:
        """Mean seconds per (kind, stage) and mean saved bytes per stage on this rank."""
        per_stage: dict[int, dict[str, float]] = defaultdict(dict)
        for (kind, stage), values in self._durations.items():
            per_stage[stage][kind.value] = statistics.fmean(values)
        for stage, values in self._bytes.items():
            per_stage[stage]["activation_bytes"] = statistics.fmean(values)
        for stage, values in self._wgrad_bytes.items():
            per_stage[stage]["wgrad_bytes"] = statistics.fmean(values)
        transfer = statistics.fmean(self._transfers) if self._transfers else None
        return {"stages": dict(per_stage), "t_comm": self.t_comm, "t_offload": transfer,
                "message_cpu": {side: (sum(values), len(values))
                                for side, values in self._message_cpu.items()}}

    def cost_model(self) -> CostModel:
        """Gather every rank's measurements (collective) into one CostModel."""
        if not self._durations:
            raise ValueError("record() at least one minibatch past warmup_minibatches first")
        gathered = [None] * dist.get_world_size(self.pp_group)
        dist.all_gather_object(gathered, self.local_costs(), group=self.pp_group)
        costs = merge_measurements(gathered, self.schedule.num_stages)
        self.stage_costs = {stage: measured for part in gathered
                            for stage, measured in part["stages"].items()}
        return costs


def merge_measurements(gathered: list[dict], num_stages: int) -> CostModel:
    """One CostModel from several ranks' :meth:`Profiler.local_costs`: per virtual stage
    the mean over the ranks that measured it (data-parallel replicas of a stage), fused BW
    split evenly into B and W; the slowest neighbour transfer as ``t_comm``; the mean
    per-message send/receive CPU cost over every rank's messages; the slowest host-link
    transfer as the offload bandwidth; memory deltas from ``memory_deltas``."""
    samples: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for part in gathered:
        for stage, measured in part["stages"].items():
            for kind, value in measured.items():
                samples[int(stage)][kind].append(float(value))
    missing = [stage for stage in range(num_stages) if "F" not in samples[stage]]
    if missing:
        raise ValueError(f"no forward time measured for stages {missing} (profile at least "
                         "one minibatch past the warm-up on every stage)")
    t_f, t_b, t_w = [], [], []
    for stage in range(num_stages):
        mean = {kind: statistics.fmean(values) for kind, values in samples[stage].items()}
        t_f.append(mean["F"])
        if "B" in mean:
            t_b.append(mean["B"])
            t_w.append(mean.get("W", 0.0))
        else:
            t_b.append(mean["BW"] / 2)
            t_w.append(mean["BW"] / 2)
    comms = [part["t_comm"] for part in gathered if part["t_comm"] is not None]
    transfers = [part["t_offload"] for part in gathered if part.get("t_offload")]
    message_cpu = {}
    for side in ("send", "recv"):
        total = sum(part["message_cpu"][side][0] for part in gathered if "message_cpu" in part)
        count = sum(part["message_cpu"][side][1] for part in gathered if "message_cpu" in part)
        message_cpu[side] = total / count if count else 0.0
    mem_f, mem_b, mem_w = memory_deltas(samples)
    return CostModel(t_f=t_f, t_b=t_b, t_w=t_w, t_comm=max(comms) if comms else 0.0,
                     t_send_cpu=message_cpu["send"], t_recv_cpu=message_cpu["recv"],
                     offload_bandwidth=1.0 / max(transfers) if transfers else None,
                     mem_f=mem_f, mem_b=mem_b, mem_w=mem_w)


def memory_deltas(samples: dict) -> tuple[float, float, float]:
    """(mem_f, mem_b, mem_w) from per-stage byte samples (``{stage: {"activation_bytes":
    [...], "wgrad_bytes": [...]}}``); see the module docstring."""
    shares = []
    for measured in samples.values():
        saved = statistics.fmean(measured["activation_bytes"]) \
            if measured.get("activation_bytes") else 0.0
        if saved > 0 and measured.get("wgrad_bytes"):
            shares.append(statistics.fmean(measured["wgrad_bytes"]) / saved)
    if not shares:
        return 1.0, 0.0, -1.0
    share = min(1.0, max(0.0, max(shares)))
    return 1.0, share - 1.0, -share
