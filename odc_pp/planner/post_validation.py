"""Which planned configurations run with optimizer post-validation, and what that changes
in the prediction (issue 48).

With ``--enable-optimizer-post-validation`` no rank waits for the others between
iterations (:mod:`odc_pp.training.optimizer_step`: the global check completes during the
next minibatch), so consecutive iterations overlap and a minibatch costs the schedule's
steady period (:func:`~odc_pp.schedule.steady_state.steady_period`), not one
iteration's makespan. The zero-bubble paper times ZB-2p this way (its post-validation
section; `benchmarks/bench_planner_validation.py` reproduces its Table 4 so).

The planner turns it on for the families whose iterations can overlap: the B/W-split
schedules that end staggered (the parallelogram of ZB-H2, ZB-auto under a memory cap,
and the V family), :data:`FAMILIES`. ZB-H1 and 1F1B end on rank 0 last, so their period
is their makespan and the snapshot would cost memory for nothing. ``--fp16`` does not
compose with post-validation (the trainer refuses it), so fp16 models never get it. The
snapshot it keeps (fp32 master weights, Adam moments and gradients of the owned shard:
16 bytes per owned parameter) is counted in memory by the dry run's model and by
:func:`~odc_pp.planner.rough_memory.static_bytes`; a post-validated candidate that does
not fit is tried again without it (``Candidate.post_validation``), as one is with
--recompute-lgd.
"""

from __future__ import annotations

from odc_pp.schedule.costs import CostModel
from odc_pp.schedule.ir import Schedule
from odc_pp.schedule.steady_state import steady_period

from .config import Candidate, PlanConfig

__all__ = ["FAMILIES", "FLAG", "post_validated", "iteration_seconds"]

FAMILIES = frozenset({"zb-h2", "zb-auto", "zbv", "v-half", "v-min"})
"""Schedule families the planner runs with post-validation (see the module docstring)."""

FLAG = "--enable-optimizer-post-validation"
"""The trainer's flag, printed in a post-validated configuration's flags."""

STEADY_ITERATIONS = 2
"""Copies simulated for the steady period (the period is exact from 2 on for these
periodic schedules: ``benchmarks/bench_planner_validation.py`` checks 3)."""


def post_validated(config: PlanConfig, cand: Candidate) -> bool:
    """Whether ``cand`` runs (and is printed) with post-validation."""
    return cand.post_validation and cand.schedule in FAMILIES and \
        "--fp16" not in config.model.model_flags()


def iteration_seconds(schedule: Schedule, costs: CostModel, makespan: float) -> float:
    """A post-validated minibatch's time: the steady period of ``schedule`` under
    ``costs`` (``makespan``: one iteration's, already simulated)."""
    return steady_period(schedule, costs, iterations=STEADY_ITERATIONS, single=makespan)
