"""Every rank runs the same schedule: the frontend all-gathers ``Schedule.digest`` over
the pipeline group before a schedule's first step; a mismatch names the ranks."""

from __future__ import annotations

import pytest

from odc_pp.testing.launch import LaunchConfig, run_workers


def _worker(rank, world_size):
    import torch.distributed as dist

    from odc_pp.schedule import CostModel
    from odc_pp.schedule.generators import generate
    from odc_pp.training.replanning import check_same_schedule

    same = generate("zb-auto", pp=2, num_microbatches=4, costs=CostModel(t_w=0.5))
    digest = check_same_schedule(same, dist.group.WORLD)
    # rank 2 plans with other costs (as if it read another --cost-model)
    costs = CostModel(t_f=[1.0, 3.0], t_w=0.5) if rank == 2 else CostModel(t_w=0.5)
    other = generate("zb-auto", pp=2, num_microbatches=4, costs=costs)
    try:
        check_same_schedule(other, dist.group.WORLD, what="pipeline schedule")
    except RuntimeError as exc:
        return digest, str(exc)
    return digest, None


@pytest.mark.multiproc
def test_digest_check_agrees_then_names_the_rank_that_differs():
    results = run_workers(_worker, 3, config=LaunchConfig(timeout_s=120))
    digests = {digest for digest, _ in results}
    assert len(digests) == 1
    for _, message in results:
        assert message is not None and "ranks [2] differ from rank 0" in message, message
