"""The lowered schedules one rank runs: one :class:`~odc_pp.schedule.build.ScheduleRequest`
made from the schedule flags, built (:func:`~odc_pp.schedule.build.build`) once per
microbatch count for training and for evaluation, and rebuilt after ZB-auto re-planning
changes the cost model."""

from __future__ import annotations

from odc_pp.schedule.build import ScheduleRequest, build
from odc_pp.schedule.costs import CostModel
from odc_pp.schedule.ir import Schedule

from .job import training_request
from .replanning import check_same_schedule

__all__ = ["Schedules", "training_request"]


class Schedules:
    """One rank's lowered schedules per microbatch count (LB-Mini varies it between
    iterations), training and forward-only, under the current cost model. The first use
    of each checks that every rank of the pipeline -- and of the stage's tensor-parallel
    group -- planned the same one (collective over those groups)."""

    def __init__(self, request: ScheduleRequest, costs: CostModel, *, pp_group=None,
                 tp_group=None, dp_rank: int = 0) -> None:
        self.request = request
        self.costs = costs
        self.pp_group = pp_group
        self.tp_group = tp_group
        self.dp_rank = dp_rank
        self._cache: dict[tuple[int, bool], Schedule] = {}

    def plan(self, num_microbatches: int, costs: CostModel | None = None) -> Schedule:
        """The training schedule at ``num_microbatches`` under ``costs`` (default: the
        current ones), built anew and not cached."""
        return build(self.request.with_microbatches(num_microbatches),
                     self.costs if costs is None else costs)

    def training(self, num_microbatches: int) -> Schedule:
        """The training schedule for this replica's microbatch count (cached)."""
        return self._get(num_microbatches, forward_only=False)

    def evaluation(self, num_microbatches: int) -> Schedule:
        """The forward-only schedule (evaluation) for a microbatch count (cached)."""
        return self._get(num_microbatches, forward_only=True)

    def replan(self, costs: CostModel) -> None:
        """Switch to ``costs`` (the measured costs ZB-auto and --fill-pipeline-gaps re-plan
        from): every schedule is rebuilt lazily from them."""
        self.costs = costs
        self._cache.clear()

    def _get(self, num_microbatches: int, *, forward_only: bool) -> Schedule:
        if num_microbatches < 1:
            raise ValueError(f"data-parallel rank {self.dp_rank} got no microbatch; raise "
                             "--global-batch-size")
        key = (num_microbatches, forward_only)
        if key not in self._cache:
            request = self.request.with_microbatches(num_microbatches)
            if forward_only:
                request = request.evaluation()
            schedule = build(request, self.costs)
            what = "evaluation schedule" if forward_only else "pipeline schedule"
            # before the first step with it: every rank of the pipeline must run this
            # plan, and so must the stage's tensor-parallel ranks (their collectives
            # inside F/B/W pair up only if they run the same actions in the same order)
            check_same_schedule(schedule, self.pp_group, what=what)
            if self.tp_group is not None:
                check_same_schedule(schedule, self.tp_group,
                                    what=f"{what} of the tensor-parallel ranks")
            self._cache[key] = schedule
        return self._cache[key]
