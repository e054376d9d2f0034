"""PipeOffload's schedules from the training flags: GIS (--pipeline-schedule gis with
--microbatch-group-size-per-virtual-pipeline-stage), PO-H / PO-F (offload, group size 1,
--selective-offload, --offload-chunks), and the one-line refusals."""

from __future__ import annotations

import pytest

from odc_pp.schedule.build import build
from odc_pp.schedule.costs import CostModel
from odc_pp.training.arguments import parse_args
from odc_pp.training.schedules import training_request

FLAG = "--microbatch-group-size-per-virtual-pipeline-stage"


def _args(*extra):
    return parse_args(["--mock-data", "--vocab-size", "64", "--num-layers", "4", *extra])


def test_gis_group_size_reaches_the_schedule():
    args = _args("--pipeline-schedule", "gis", FLAG, "1")
    request = training_request(args.schedule, pp=2, num_microbatches=4)
    assert dict(request.options)["group_size"] == 1
    assert build(request).meta["group_size"] == 1


def test_po_f_flags_build_a_selective_offload():
    args = _args("--pipeline-schedule", "offload", "--cpu-offload", FLAG, "1",
                 "--selective-offload")
    request = training_request(args.schedule, pp=2, num_microbatches=8)
    assert request.selective_offload and dict(request.options)["group_size"] == 1
    schedule = build(request, CostModel(offload_bandwidth=1.0))
    assert "offload_skipped" in schedule.meta
    assert any(a.kind.value == "OFFLOAD" for a in schedule.actions())


@pytest.mark.parametrize("flags,message", [
    (["--pipeline-schedule", "zbv", FLAG, "2"], "needs a grouped --pipeline-schedule"),
    (["--pipeline-schedule", "interleaved", "--pipeline-model-parallel-size", "4",
      "--num-layers", "8", FLAG, "2"], "below pp"),
    (["--pipeline-schedule", "gis", "--pipeline-model-parallel-size", "2", FLAG, "3"],
     r"must be in 1\.\.2"),
    (["--pipeline-schedule", "gis", "--selective-offload"], "--selective-offload needs"),
])
def test_bad_group_or_selective_flags_are_refused(flags, message):
    with pytest.raises(ValueError, match=message):
        _args(*flags)
