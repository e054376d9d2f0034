"""Stream-ordered receive waits with a watchdog (odc_pp.runtime.p2p) and the start-up
warm-up (odc_pp.runtime.warmup), with fake works: no process group, no GPU."""

from __future__ import annotations

import pytest
import torch

from odc_pp.runtime.p2p import PeerTransport, TorchP2POps, Watchdog
from odc_pp.runtime.p2p_channels import Communicator, PipelineChannels
from odc_pp.runtime.warmup import warm_up


class FakeWork:
    def __init__(self, completed=False):
        self.completed = completed
        self.waits = 0

    def is_completed(self):
        return self.completed

    def wait(self, timeout=None):
        self.waits += 1
        return True


def test_device_wait_is_stream_ordered_and_watched():
    watchdog = Watchdog()
    ops = TorchP2POps(torch.device("cuda", 0), watchdog=watchdog)  # no CUDA call made
    work = FakeWork()
    watchdog._thread = object()  # keep the background thread out of this unit test
    assert ops.wait(work, 5.0, what="pipeline rank 0: RECV_F0.1 (peer: pipeline rank 1)")
    assert work.waits == 1  # work.wait() ordered the stream; the host did not poll
    assert watchdog.pending_count() == 1


def test_watchdog_names_the_overdue_transfer_and_raises_on_the_next_call():
    watchdog = Watchdog()
    watchdog._thread = object()
    done, stuck = FakeWork(completed=True), FakeWork()
    watchdog.watch(done, 1.0, "send to 2")
    watchdog.watch(stuck, 1.0, "pipeline rank 0: RECV_B0.0 (peer: pipeline rank 1, global "
                               "rank 1)")
    import time
    assert watchdog.check(time.monotonic()) is None  # before the deadline
    assert watchdog.pending_count() == 1  # the completed one was dropped
    error = watchdog.check(time.monotonic() + 2.0)
    assert isinstance(error, TimeoutError)
    assert "peer: pipeline rank 1" in str(error) and "within 1s" in str(error)
    with pytest.raises(TimeoutError, match="RECV_B0.0"):
        watchdog.watch(FakeWork(), 1.0, "next")


def test_watchdog_thread_ends_the_process_when_the_host_never_comes_back():
    ended = []
    watchdog = Watchdog(period_s=0.01, grace_s=0.05, on_expired=ended.append)
    watchdog.watch(FakeWork(), 0.01, "pipeline rank 1: RECV_F0.0 (peer: pipeline rank 0)")
    watchdog._thread.join(timeout=30)
    assert len(ended) == 1 and "peer: pipeline rank 0" in str(ended[0])


def test_transport_passes_the_peer_to_the_device_wait():
    seen = []

    class Ops:
        def irecv(self, tensor, peer, group, tag):
            return FakeWork()

        def wait(self, work, timeout_s, what=""):
            seen.append(what)
            return True

    channels = PipelineChannels(ranks=[4, 5], groups={(0, 1): "g01", (1, 0): "g10"})
    transport = PeerTransport(channels=channels, rank=1, device=torch.device("cpu"),
                              timeout_s=3, ops=Ops())
    message = transport.post_recv(0, 7, "RECV_F0.0 (from rank 0)",
                                  shape=(torch.Size([2]), torch.float32))
    transport.wait(message)
    assert seen == ["pipeline rank 1: RECV_F0.0 (from rank 0) (peer: pipeline rank 0, "
                    "global rank 4)"]


class RecordingOps:
    def __init__(self, complete=True):
        self.touched = []
        self.complete = complete

    def touch(self, group):
        self.touched.append(group)
        return FakeWork(completed=True)

    def wait(self, work, timeout_s, *, block_host=False):
        assert block_host  # the warm-up waits on the host
        return self.complete


def test_warm_up_touches_this_ranks_groups_in_the_global_order():
    comms = [Communicator(ranks=(1, 2), kind="p2p", detail=(2, 1), group="p2p 2->1"),
             Communicator(ranks=(0, 1, 2, 3), kind="world", group="world"),
             Communicator(ranks=(1, 2), kind="p2p", detail=(1, 2), group="p2p 1->2"),
             Communicator(ranks=(0, 1), kind="pp", group="pp 0,1"),
             Communicator(ranks=(2, 3), kind="dp", group="dp 2,3"),  # not rank 1's
             Communicator(ranks=(1,), kind="dp", group="dp 1")]  # one member: no creation
    ops = RecordingOps()
    assert warm_up(comms, ops=ops, rank=1, timeout_s=5) == 4
    assert ops.touched == ["pp 0,1", "world", "p2p 1->2", "p2p 2->1"]


def test_warm_up_timeout_names_the_rank_and_the_members():
    comms = [Communicator(ranks=(0, 3), kind="p2p", detail=(3, 0), group="g")]
    with pytest.raises(TimeoutError, match=r"rank 0: warm-up of the p2p 3->0 group of "
                                           r"global ranks \[0, 3\].*ranks \[3\]"):
        warm_up(comms, ops=RecordingOps(complete=False), rank=0, timeout_s=2)
