"""Gathers start at the reader's own shard and go round, ``(rank + i) % W``, with one
stream per owner on CUDA; CUDA IPC is used only where every peer's GPU is visible and
peer-accessible. CPU only: CUDA streams and queries are mocked."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import odc_pp.odc.transport_cuda as transport_cuda
from odc_pp.odc.transport_cuda import CudaIpcPath, ipc_peer_problem
from odc_pp.odc.transport_host import HostPath
from odc_pp.odc.transport_path import peer_order, shard_range


def test_peer_order_rotates_from_the_reader():
    assert peer_order(range(4), 0, 4) == [0, 1, 2, 3]
    assert peer_order(range(4), 2, 4) == [2, 3, 0, 1]
    assert peer_order([1, 3, 6], 4, 8) == [6, 1, 3]  # a subset (this host's peers)
    # at each step i the W readers read W different owners
    for world in (2, 3, 8):
        for step in range(world):
            assert sorted(peer_order(range(world), r, world)[step]
                          for r in range(world)) == list(range(world))


class FakeStream:
    log: list = []

    def __init__(self, device_index):
        self.name = None

    def after_current(self):
        FakeStream.log.append(("after_current", self.name))

    def copy(self, dst, src, nbytes):
        FakeStream.log.append(("copy", self.name, src))

    def record(self, stream=None):
        return f"event-{self.name}"

    def current_waits(self, event=None):
        FakeStream.log.append(("current_waits", self.name, event))


def _cuda_path(monkeypatch, rank, world):
    monkeypatch.setattr(transport_cuda, "CudaStream", FakeStream)
    FakeStream.log = []
    bases = [1000 * (peer + 1) for peer in range(world)]
    path = CudaIpcPath(host=SimpleNamespace(rank=rank, world_size=world),
                       locate=lambda tensor, what: (SimpleNamespace(peer_bases=bases), 0),
                       timeout_s=5)
    original = path.stream

    def named_stream(device, kind, peer=None):
        stream = original(device, kind, peer)
        stream.name = (kind, peer)
        return stream

    path.stream = named_stream
    return path, bases


@pytest.mark.parametrize("async_op", [False, True])
def test_cuda_gather_reads_owners_from_rank_plus_one_on_a_stream_each(monkeypatch,
                                                                       async_op):
    path, bases = _cuda_path(monkeypatch, rank=2, world=4)
    output = torch.zeros(8)  # device "cuda:0" is only used as a cache key here
    output_device = torch.device("cuda", 0)
    monkeypatch.setattr(torch.Tensor, "device", property(lambda self: output_device))
    work = path.gather(output, torch.zeros(2), async_op=async_op)
    copies = [entry for entry in FakeStream.log if entry[0] == "copy"]
    assert [c[2] for c in copies] == [bases[2], bases[3], bases[0], bases[1]]
    assert [c[1] for c in copies] == [("gather", 2), ("gather", 3), ("gather", 0),
                                      ("gather", 1)]
    if async_op:
        assert not any(e[0] == "current_waits" for e in FakeStream.log)
        work.wait()
    waits = [e for e in FakeStream.log if e[0] == "current_waits"]
    assert [w[1] for w in waits] == [("gather", p) for p in (2, 3, 0, 1)]


def test_host_gather_reads_owners_in_the_rotated_order():
    reads = []
    path = HostPath.__new__(HostPath)
    path.rank, path.world_size = 1, 3
    path.peers = peer_order(range(3), 1, 3)
    path._locate = lambda tensor, what: (None, 0)
    path._read = lambda peer, allocation, offset, out, nbytes: reads.append(peer)
    path.gather(torch.zeros(9), torch.zeros(3))
    assert reads == [1, 2, 0]
    assert shard_range(9, 1, 3) == (3, 6)


def test_ipc_needs_every_peer_visible_and_peer_accessible():
    visible = {"0000:1b:00.0": 0, "0000:2c:00.0": 1}
    locate = lambda bus: visible.get(bus, -1)  # noqa: E731
    assert ipc_peer_problem(0, {1: "0000:2c:00.0"}, locate=locate,
                            can_access=lambda a, b: True) is None
    # each process sees only its own GPU (CUDA_VISIBLE_DEVICES per rank)
    problem = ipc_peer_problem(0, {1: "0000:3d:00.0"}, locate=locate,
                               can_access=lambda a, b: True)
    assert "group rank 1" in problem and "not visible" in problem
    # visible but no peer access
    problem = ipc_peer_problem(0, {3: "0000:2c:00.0"}, locate=locate,
                               can_access=lambda a, b: False)
    assert "no peer access to cuda:1" in problem and "group rank 3" in problem
    # two processes on one GPU need no peer access
    assert ipc_peer_problem(0, {1: "0000:1b:00.0"}, locate=locate,
                            can_access=lambda a, b: False) is None
