"""Our ZB-V emits the same compute order as torch.distributed.pipelining's
``ScheduleZBVZeroBubble`` (uniform costs), so ``benchmarks/bench_runtime.py`` compares
two runtimes on one schedule: any gap between them is in how the actions run, not in
their order (issue 31)."""

from __future__ import annotations

import types

import pytest

schedules = pytest.importorskip("torch.distributed.pipelining.schedules")

from odc_pp.schedule import CostModel  # noqa: E402
from odc_pp.schedule.generators import generate  # noqa: E402


def _torch_order(pp: int, microbatches: int) -> str:
    method = getattr(schedules.ScheduleZBVZeroBubble, "_calculate_single_rank_operations",
                     None)
    if method is None:
        pytest.skip("this torch computes ScheduleZBVZeroBubble's order elsewhere")
    state = types.SimpleNamespace(pp_group_size=pp, _n_microbatches=microbatches,
                                  num_stages=2 * pp)
    return "\n".join(",".join(str(action) for action in method(state, rank)
                              if action is not None) for rank in range(pp))


@pytest.mark.parametrize("pp,microbatches", [(2, 4), (2, 8), (3, 6), (4, 8), (4, 16)])
def test_zbv_compute_order_equals_pytorchs(pp, microbatches):
    ours = generate("zbv", pp=pp, num_microbatches=microbatches, costs=CostModel())
    assert ours.to_pipelining_csv().replace("\r", "").strip() == _torch_order(pp, microbatches)
