"""Issue 32: the context-parallel ring under NCCL's ordering rules
(odc_pp.schedule.nccl_order.check_ring_order): the ring attention's own plan
(``ring_comm_plan``: per step one batch, sends and receives together) completes for
every ring size, forward and backward; a deliberately mis-ordered ring -- the same
messages with every send posted as its own batch before the receives, which gloo's
buffered sends would let through -- deadlocks, and the error names the stuck ranks."""

from __future__ import annotations

import pytest

from odc_pp.megatron.context_parallel import ring_comm_plan
from odc_pp.schedule.checks import ScheduleError
from odc_pp.schedule.nccl_order import check_ring_order


@pytest.mark.parametrize("size", [2, 3, 4, 8])
@pytest.mark.parametrize("backward", [False, True])
def test_the_ring_attention_plan_completes(size, backward):
    check_ring_order({r: ring_comm_plan(r, size, backward=backward) for r in range(size)})


def _sends_first(plan):
    """Each batch split: its sends one by one, then its receives as one batch."""
    out = []
    for batch in plan:
        out += [[op] for op in batch if op[0] == "send"]
        receives = [op for op in batch if op[0] == "recv"]
        if receives:
            out.append(receives)
    return out


@pytest.mark.parametrize("size", [2, 4])
def test_a_mis_ordered_ring_deadlocks(size):
    plans = {r: _sends_first(ring_comm_plan(r, size, backward=True)) for r in range(size)}
    with pytest.raises(ScheduleError, match="deadlocks under NCCL's FIFO order") as error:
        check_ring_order(plans)
    message = str(error.value)
    assert all(f"rank {r} batch 0 waits: send kv to rank {(r + 1) % size}" in message
               for r in range(size)), message


def test_a_missing_receive_is_named():
    plans = {r: ring_comm_plan(r, 2, backward=False) for r in range(2)}
    plans[1] = []  # rank 1 never posts its batch
    with pytest.raises(ScheduleError, match="rank 0 batch 0 waits: send kv to rank 1"):
        check_ring_order(plans)
