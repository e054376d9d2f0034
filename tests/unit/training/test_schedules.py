"""Schedules: the one owner of a rank's lowered schedules (cache, evaluation, re-planning)."""

from __future__ import annotations

import pytest

from odc_pp.schedule.build import build
from odc_pp.schedule.costs import CostModel
from odc_pp.schedule.ir import ActionKind
from odc_pp.training import schedules as module
from odc_pp.training.arguments import parse_args
from odc_pp.training.schedules import Schedules, training_request


@pytest.fixture
def checked(monkeypatch):
    """The (schedule digest, what) of every cross-rank check (one process: recorded)."""
    calls = []
    monkeypatch.setattr(module, "check_same_schedule",
                        lambda schedule, group, *, what: calls.append((schedule.digest(),
                                                                       group, what)))
    return calls


def _args(*extra):
    return parse_args(["--mock-data", "--vocab-size", "64", "--pipeline-schedule", "zb-h1",
                       "--num-layers", "4", *extra])


def test_training_request_follows_the_flags():
    args = _args("--memory-limit", "3")
    request = training_request(args.schedule, pp=2, num_microbatches=4, post_validation=True)
    assert (request.name, request.pp, request.num_microbatches, request.memory_limit,
            request.post_validation) == ("zb-h1", 2, 4, 3.0, True)


def test_cached_per_microbatch_count_checked_once_and_rebuilt_after_replan(checked):
    args = _args()
    request = training_request(args.schedule, pp=2, num_microbatches=1, post_validation=True)
    schedules = Schedules(request, CostModel(), pp_group="pp", tp_group="tp")
    first = schedules.training(4)
    assert schedules.training(4) is first and schedules.training(6) is not first
    assert first.ranks == build(request.with_microbatches(4)).ranks
    assert [(g, w) for _, g, w in checked] == [
        ("pp", "pipeline schedule"), ("tp", "pipeline schedule of the tensor-parallel ranks")] * 2
    forward = schedules.evaluation(4)
    assert {a.kind for a in forward.actions()} <= {ActionKind.F, ActionKind.SEND_F,
                                                   ActionKind.RECV_F}
    assert checked[-2][2] == "evaluation schedule"
    measured = CostModel(t_f=1.0, t_b=3.0, t_w=0.5)
    assert schedules.plan(4, measured).ranks == build(request.with_microbatches(4),
                                                      measured).ranks
    assert schedules.training(4) is first  # plan() does not touch the cache
    schedules.replan(measured)
    assert schedules.costs is measured and schedules.training(4) is not first
    assert schedules.training(4).ranks == build(request.with_microbatches(4), measured).ranks


def test_no_microbatch_names_the_flag(checked):
    schedules = Schedules(training_request(_args().schedule, pp=2, num_microbatches=1),
                          CostModel(), dp_rank=3)
    with pytest.raises(ValueError, match="rank 3 got no microbatch.*--global-batch-size"):
        schedules.training(0)
