"""The one test/benchmark launcher: results in rank order, a failing rank is named, queued
messages reach the parent, and nothing hangs."""

import pytest

from odc_pp.testing.launch import LaunchConfig, run_workers


def _square(rank, world_size, offset):
    return rank * rank + offset


def _fail_on_one(rank, world_size):
    if rank == 1:
        raise ValueError("rank one refuses")
    return rank


def _report(rank, world_size, queue):
    queue.put(("ready", rank))
    return "x" * 200_000  # larger than a pipe buffer: must arrive whole


@pytest.mark.multiproc
def test_results_errors_and_messages():
    assert run_workers(_square, 3, 10, config=LaunchConfig(timeout_s=120)) == [10, 11, 14]
    with pytest.raises(RuntimeError, match="rank 1 failed:(.|\n)*rank one refuses"):
        run_workers(_fail_on_one, 2, config=LaunchConfig(timeout_s=120))
    seen = []
    values = run_workers(_report, 2, config=LaunchConfig(timeout_s=120, pass_queue=True),
                         on_message=lambda message, processes: seen.append(message))
    assert sorted(seen) == [("ready", 0), ("ready", 1)] and values == ["x" * 200_000] * 2
