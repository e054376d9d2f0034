"""A CPU point-to-point backend with NCCL's ordering semantics, for tests.

gloo matches messages by tag and connects eagerly; NCCL creates a communicator lazily
and runs the operations of one communicator in issue order on one stream.
:class:`NcclSemanticsOps` has the methods ``PeerTransport`` and the warm-up call
(``isend``, ``irecv``, ``batch_isend``, ``touch``, ``wait``) and executes them like
torch's NCCL backend under :class:`odc_pp.runtime.p2p.TorchP2POps` on a device would:

* **creation rendezvous**: the first operation a rank issues on a group's communicator
  blocks the calling (host) thread until every member of the group issued its own first
  operation on it (through the default store, as NCCL's unique id travels). After
  ``creation_timeout_s`` it raises a TimeoutError naming this rank and the ranks that
  did not arrive. :meth:`collectives` applies the same rule to the collectives
  (``all_reduce``, ``all_gather_into_tensor``, ...) that run directly on gloo, e.g. the
  tensor-parallel ones;
* :meth:`collectives` also takes ``torch.distributed.batch_isend_irecv`` on the groups
  registered with :meth:`add_groups` (the context-parallel ring's batches): each batch
  runs as one unit on the group's FIFO, with the creation rule and rendezvous sends;
* **FIFO**: every operation of a group runs on the group's main communicator (on a
  device ``TorchP2POps`` sends even single operations as a batch of one); one worker
  thread per communicator runs them strictly in issue order (a batch as one unit) over
  gloo, so a receive blocks everything queued behind it;
* **rendezvous send**: a send completes only after the receiver's matching receive
  finished: the receiver acknowledges every message over a separate gloo group (taken
  conservatively);
* works answer ``is_completed()`` without blocking and are waited by polling against the
  deadline.

Construction is collective over the default group (it creates the acknowledgement groups).
A rank whose worker is stuck in a deadlock is reported by the transport's TimeoutError;
the worker threads are daemons and stay blocked until the process ends.
"""

from __future__ import annotations

import contextlib
import datetime
import inspect
import itertools
import queue
import threading
import time

import torch
import torch.distributed as dist

from odc_pp.runtime.p2p_channels import ChannelLayout, PipelineChannels, neighbour_pairs

__all__ = ["NcclSemanticsOps", "poll", "nccl_then_gloo"]

_WORKER_TIMEOUT = datetime.timedelta(minutes=10)
_COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor",
                "all_gather_object", "broadcast", "barrier")
_INSTANCES = itertools.count()


class _Work:
    def __init__(self) -> None:
        self._done = threading.Event()
        self.error: BaseException | None = None

    def is_completed(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout=None) -> bool:
        self._done.wait()
        if self.error is not None:
            raise RuntimeError(f"NCCL-semantics operation failed: {self.error}")
        return True

    def finish(self, error: BaseException | None = None) -> None:
        self.error = error
        self._done.set()


def poll(work, timeout_s: float) -> bool:
    """Poll ``work.is_completed()`` with a growing sleep until ``timeout_s`` (False
    then), then ``work.wait()``."""
    deadline = time.monotonic() + timeout_s
    sleep = 50e-6
    while not work.is_completed():
        if time.monotonic() >= deadline:
            return False
        time.sleep(sleep)
        sleep = min(sleep * 2, 5e-3)
    work.wait()
    return True


class NcclSemanticsOps:
    """NCCL-ordered point-to-point calls over the groups of ``channels`` (this rank's
    pipeline). ``creation_timeout_s``: how long a first operation waits for the other
    members of its communicator."""

    def __init__(self, channels: PipelineChannels, *, creation_timeout_s: float = 120.0
                 ) -> None:
        self._ack: dict[object, object] = {}
        if channels.layout is ChannelLayout.SHARED:
            pairs = [(channels.shared_group, channels.ranks)]
        else:
            pairs = [(channels.groups[pair], sorted(channels.ranks[r] for r in pair))
                     for pair in neighbour_pairs(len(channels.ranks))]
        for group, ranks in pairs:  # same order on every rank: collective
            self._ack[group] = dist.new_group(ranks)
        self._me = dist.get_rank()
        self._fifos: dict[int, queue.Queue] = {}
        self._lock = threading.Lock()
        # constructed collectively, so the n-th instance is the n-th on every rank
        self._scope = f"nccl-semantics-{next(_INSTANCES)}"
        self._store = dist.distributed_c10d._get_default_store()
        self._created: set[str] = set()
        self._batched: set[int] = set()
        """ids of the groups whose batch_isend_irecv :meth:`collectives` takes."""
        self.creation_timeout_s = creation_timeout_s

    # ----- the ops interface ---------------------------------------------------
    def isend(self, tensor: torch.Tensor, peer: int, group, tag: int):
        return self._issue(group, [("send", tensor, peer, group, tag)])

    def irecv(self, tensor: torch.Tensor, peer: int, group, tag: int):
        return self._issue(group, [("recv", tensor, peer, group, tag)])

    def batch_isend(self, sends: list[tuple[torch.Tensor, int, object, int]]) -> list:
        groups = {id(group): group for _, _, group, _ in sends}
        if len(groups) != 1:
            raise ValueError("batch_isend_irecv takes operations of one group")
        work = self._issue(next(iter(groups.values())),
                           [("send", tensor, peer, group, tag)
                            for tensor, peer, group, tag in sends])
        return [work]

    def add_groups(self, groups: list[tuple[object, list[int]]]) -> None:
        """Take ``batch_isend_irecv`` on more groups (``(group, global ranks)``, group None
        where this rank is not a member). Collective over the default group: every rank
        passes every group's ranks in the same order (it makes their acknowledgement
        groups)."""
        for group, ranks in groups:
            ack = dist.new_group(sorted(ranks))
            if group is not None:
                self._ack[group] = ack
                self._batched.add(id(group))

    def touch(self, group):
        """The warm-up's first operation: creates the communicator, moves no data."""
        return self._issue(group, [])

    def wait(self, work, timeout_s: float, what: str = "", *, block_host: bool = False
             ) -> bool:
        return poll(work, timeout_s)

    @contextlib.contextmanager
    def collectives(self):
        """Apply the creation rule to torch.distributed's collectives while inside."""
        originals = {name: getattr(dist, name) for name in _COLLECTIVES}

        def wrap(name, function):
            signature = inspect.signature(function)

            def first_op_creates(*args, **kwargs):
                group = signature.bind_partial(*args, **kwargs).arguments.get("group")
                self._create(group if group is not None else dist.group.WORLD)
                return function(*args, **kwargs)
            return first_op_creates

        batch_original = dist.batch_isend_irecv

        def batch_isend_irecv(p2p_ops):
            group = p2p_ops[0].group
            if id(group) not in self._batched:
                return batch_original(p2p_ops)
            if any(op.group is not group for op in p2p_ops):
                raise ValueError("batch_isend_irecv takes operations of one group")
            return [self._issue(group, [("send" if op.op is dist.isend else "recv",
                                         op.tensor, op.peer, group, op.tag)
                                        for op in p2p_ops])]

        try:
            for name, function in originals.items():
                setattr(dist, name, wrap(name, function))
            dist.batch_isend_irecv = batch_isend_irecv
            yield self
        finally:
            for name, function in originals.items():
                setattr(dist, name, function)
            dist.batch_isend_irecv = batch_original

    # ----- creation ------------------------------------------------------------
    def _create(self, group) -> None:
        """Block until every member of ``group`` reached its first operation on it."""
        name = group.group_name
        if name in self._created:
            return
        ranks = dist.get_process_group_ranks(group)
        prefix = f"{self._scope}/{name}"
        self._store.set(f"{prefix}/{self._me}", "1")
        others = [r for r in ranks if r != self._me]
        try:
            self._store.wait([f"{prefix}/{r}" for r in others],
                             datetime.timedelta(seconds=self.creation_timeout_s))
        except RuntimeError as error:  # DistStoreError: the wait timed out
            missing = [r for r in others if not self._store.check([f"{prefix}/{r}"])]
            raise TimeoutError(
                f"rank {self._me}: the first operation on the communicator of global ranks "
                f"{ranks} blocks in its creation until every member issues its first "
                f"operation on it; rank(s) {missing} did not within "
                f"{self.creation_timeout_s:g}s (NCCL creates communicators lazily)"
            ) from error
        self._created.add(name)

    # ----- execution -----------------------------------------------------------
    def _issue(self, group, ops: list) -> _Work:
        self._create(group)  # on the calling thread: the host blocks, as with NCCL
        work = _Work()
        with self._lock:
            fifo = self._fifos.get(id(group))
            if fifo is None:
                fifo = self._fifos[id(group)] = queue.Queue()
                threading.Thread(target=self._run, args=(fifo,), daemon=True,
                                 name=f"nccl-semantics-{group.group_name}").start()
        fifo.put((ops, work))
        return work

    def _run(self, fifo: queue.Queue) -> None:
        while True:
            ops, work = fifo.get()
            try:
                self._execute(ops)
            except BaseException as error:  # noqa: BLE001 - handed to the waiter
                work.finish(error)
            else:
                work.finish()

    def _execute(self, ops: list) -> None:
        data = []
        for kind, tensor, peer, group, tag in ops:
            call = dist.isend if kind == "send" else dist.irecv
            data.append(call(tensor, peer, group=group, tag=tag))
        for item in data:
            _wait(item)
        acks = []
        for kind, _, peer, group, tag in ops:  # rendezvous: a send ends when received
            flag = torch.zeros(1)
            call = dist.irecv if kind == "send" else dist.isend
            acks.append((call(flag, peer, group=self._ack[group], tag=tag), flag))
        for item, _ in acks:
            _wait(item)


def _wait(work) -> None:
    """One blocking wait (it releases the GIL, so the rank's other threads run). Never in
    slices: a gloo point-to-point wait that times out closes the connection ("Application
    timeout caused pair closure"), losing the message in flight -- with slices of 50 ms
    every exchange that waited longer than that hung. The transport's deadline on the
    rank's main thread reports a stuck operation; this wait only bounds the worker."""
    work.wait(timeout=_WORKER_TIMEOUT)


def nccl_then_gloo(chunks, schedule, microbatches, topo, ops, *, comm_timeout_s: float
                   ) -> tuple[bool, float | None]:
    """One minibatch of ``chunks`` under NCCL's order (``ops``; without the warm-up its
    first message hangs), then under gloo's tag matching: (losses and gradients bitwise
    equal, the NCCL-ordered run's loss sum)."""
    from odc_pp.runtime import PipelineRuntime, RuntimeConfig

    outcome = []
    for p2p_ops in (ops, None):
        for chunk in chunks:
            chunk.zero_grad(set_to_none=True)
        runtime = PipelineRuntime(RuntimeConfig(comm_timeout_s=comm_timeout_s,
                                                prepost_receives=False),
                                  chunks=chunks, pp_group=topo.pp_group,
                                  channels=topo.pp_channels, p2p_ops=p2p_ops)
        result = runtime.run_minibatch(schedule, microbatches)
        outcome.append((result.loss_sum, [p.grad.clone() for c in chunks
                                          for p in c.parameters()]))
    (loss_nccl, grads_nccl), (loss_gloo, grads_gloo) = outcome
    same = loss_gloo == loss_nccl and all(torch.equal(a, b)
                                          for a, b in zip(grads_gloo, grads_nccl))
    return same, loss_nccl

