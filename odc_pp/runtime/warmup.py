"""Start-up warm-up of every communicator, in one global order.

NCCL may create a group's communicator lazily, at the first operation a rank issues on
it, and that first operation blocks the host until every member issued its own first
operation on the group. A pipeline posts a comm group's receives before its sends, so
with lazy creation 1F1B at pp=2 hangs at its first message: rank 0's first receive
(channel 1 -> 0) blocks in creation before rank 0 posts the send rank 1 waits for.

:func:`warm_up` touches each communicator a rank belongs to once (a one-element
all-reduce: on NCCL it runs on the group's main communicator, the one
``batch_isend_irecv`` uses) in :func:`odc_pp.runtime.p2p_channels.warmup_order` and waits
for it on the host (creation may also be non-blocking: ``TORCH_NCCL_USE_COMM_NONBLOCKING``),
so every creation happens here, in the same order on every rank, and none in the
schedule. It holds whether or not torch already created the communicators eagerly
(``device_id``), whatever the torch version or ``TORCH_NCCL_*`` setting: an eager
communicator just makes the touch cheap. Why one order cannot deadlock: take the first
communicator in the order that some member never gets past; each of its members either
reached it or waits in an earlier one, which all its members pass by the choice of the
first -- so all reach it and it completes. See docs/nccl_ordering.md.
"""

from __future__ import annotations

from .p2p_channels import Communicator, warmup_order

__all__ = ["warm_up"]


def warm_up(communicators: list[Communicator], *, ops, rank: int, timeout_s: float) -> int:
    """Touch every communicator with ``rank`` among its members and more than one
    member, in the global order, waiting for each (``ops``: a
    :class:`odc_pp.runtime.p2p.TorchP2POps` or a test backend with ``touch`` and
    ``wait``). Raise TimeoutError naming the rank and the group's members when a touch
    does not complete within ``timeout_s``. Returns how many were touched."""
    touched = 0
    for comm in warmup_order(communicators):
        if rank not in comm.ranks or len(comm.ranks) < 2:
            continue
        if comm.group is None:
            raise ValueError(f"rank {rank}: the {comm.describe()} has no process group")
        work = ops.touch(comm.group)
        try:
            completed = ops.wait(work, timeout_s, block_host=True)
        except RuntimeError as error:
            raise TimeoutError(f"rank {rank}: warm-up of the {comm.describe()} failed "
                               f"(waiting for ranks {list(comm.ranks)}): {error}") from error
        if not completed:
            others = [r for r in comm.ranks if r != rank]
            raise TimeoutError(f"rank {rank}: warm-up of the {comm.describe()} did not "
                               f"complete within {timeout_s:g}s: one of ranks {others} did "
                               "not reach it")
        touched += 1
    return touched
