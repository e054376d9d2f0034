"""Re-planning from measured costs (``--pipeline-schedule zb-auto``, or any schedule with
``--fill-pipeline-gaps``).

The first ``--profile-iters`` iterations run the plan made for the initial cost
model (``--cost-model`` or uniform costs) while a :class:`~odc_pp.runtime.Profiler`
records every action's busy time (the first iteration is a warm-up when there are
several) and the neighbour transfer time. Then every rank all-gathers every rank's
per-stage means (all pp x dp ranks: the replicas of a stage are averaged), so all ranks
hold the same :class:`~odc_pp.schedule.costs.CostModel` and plan from it
deterministically (the search is bounded by evaluations, never by time) -- the same
schedule on every data-parallel replica, which collective data parallelism needs (the
ranks check this with ``check_same_schedule``: an all-gather of ``Schedule.digest``).
Rank 0 logs the step time the simulator predicts, under the measured costs, for the old and the new plan.
Re-planning changes the order of the actions, not the math: the losses stay the same.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from odc_pp.dtypes import float_dtype
from odc_pp.runtime.profiler import Profiler, ProfilerConfig, merge_measurements

__all__ = ["Replanner", "check_same_schedule", "check_same_digest"]


def check_same_schedule(schedule, group=None, *, what: str = "schedule") -> str:
    """All-gather ``schedule.digest()`` over ``group`` (None: all ranks; collective, under
    the group's timeout) and raise RuntimeError naming the ranks whose plan differs from
    the first rank's. Returns the digest."""
    return check_same_digest(
        schedule.digest(), group, what=what,
        hint="every rank must run the same schedule -- check that all ranks get the same "
             "--cost-model, --pipeline-schedule and microbatch count")


def check_same_digest(digest: str, group=None, *, what: str, hint: str) -> str:
    """:func:`check_same_schedule` for any plan's ``digest`` (``hint``: what to check when
    the ranks differ)."""
    digests = [None] * dist.get_world_size(group)
    dist.all_gather_object(digests, digest, group=group)
    if len(set(digests)) != 1:
        ranks = (list(range(len(digests))) if group is None
                 else dist.get_process_group_ranks(group))
        reference = digests[0]
        differ = [rank for rank, d in zip(ranks, digests) if d != reference]
        raise RuntimeError(
            f"ranks planned different {what}s: ranks {differ} differ from rank {ranks[0]} "
            f"(digests {', '.join(f'rank {r}: {d[:12]}' for r, d in zip(ranks, digests))}); "
            f"{hint}")
    return digest


class Replanner:
    """Profiles the first iterations, then swaps in the schedule re-planned from them."""

    def __init__(self, job, topo) -> None:
        args = job.args
        self.args, self.family = args, job.family
        self.topo = topo
        self.profiler: Profiler | None = None
        replans = job.family.searched or args.schedule.fill_pipeline_gaps
        self.done = not replans or args.schedule.profile_iters == 0
        self.recorded = 0

    def observe(self, parts, result, *, max_microbatches: int, out=None) -> bool:
        """Record one iteration; after the last profiled one, re-plan (collective over
        all ranks). True when the schedule changed."""
        if self.done:
            return False
        if self.profiler is None:
            warmup = 1 if self.args.schedule.profile_iters > 1 else 0
            schedule = result.schedule  # the stage layout only
            self.profiler = Profiler(ProfilerConfig(warmup_minibatches=warmup),
                                     schedule=schedule, pp_group=self.topo.pp_group)
        self.profiler.record(result.minibatch)
        self.recorded += 1
        if self.recorded < self.args.schedule.profile_iters:
            return False
        self.done = True
        self._replan(parts, max_microbatches, out)
        return True

    def _replan(self, parts, num_microbatches: int, out) -> None:
        from odc_pp.schedule.simulator import simulate

        args, topo = self.args, self.topo
        dtype = float_dtype(args.model.compute_dtype)
        sample = torch.zeros(args.model.seq_length, args.data.micro_batch_size, args.model.hidden_size,
                             dtype=dtype, device=topo.device)
        self.profiler.measure_comm(sample)
        gathered = [None] * topo.world_size
        dist.all_gather_object(gathered, self.profiler.local_costs())
        num_stages = self.profiler.schedule.num_stages
        measured = merge_measurements(gathered, num_stages)
        old = parts.schedules.plan(num_microbatches)
        new = parts.schedules.plan(num_microbatches, measured)
        name = self.family.name
        check_same_schedule(new, what=f"re-planned {name} schedule")
        parts.schedules.replan(measured)  # every schedule rebuilt lazily from these costs
        if topo.rank == 0 and out is not None:
            before = simulate(old, measured).makespan
            after = simulate(new, measured).makespan
            stages = ", ".join(f"{f * 1e3:.2f}/{b * 1e3:.2f}/{w * 1e3:.2f}" for f, b, w in
                               zip(measured.t_f, measured.t_b, measured.t_w))
            filled = new.meta.get("gap_fill")
            moves = f"; {filled['moves']} W's moved into gaps" if filled else ""
            print(f"{name} re-planned from measured costs (T_F/T_B/T_W ms per stage: "
                  f"{stages}; T_comm {measured.t_comm * 1e3:.2f} ms): predicted step time "
                  f"{before * 1e3:.1f} ms -> {after * 1e3:.1f} ms at {num_microbatches} "
                  f"microbatches{moves}", file=out, flush=True)
