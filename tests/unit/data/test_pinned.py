"""Microbatch host-to-device copies through reusable pinned buffers (odc_pp.data.pinned,
issue 50). CPU: the pool's choice of buffer (reuse once the last copy out of it finished,
a new one while it is in flight, wait for the oldest past the cap) with stand-in events
and allocator; the model's and the runtime's copies go through it."""

from __future__ import annotations

import pathlib

import torch

from odc_pp.data import pinned

ROOT = pathlib.Path(__file__).resolve().parents[3]


class _Event:
    def __init__(self, log):
        self.done, self.log = False, log

    def record(self):
        self.done = False
        self.log.append("record")

    def query(self):
        return self.done

    def synchronize(self):
        self.log.append("wait")
        self.done = True


def _pool(log, max_buffers=2):
    allocated = []

    def pin(shape, dtype):
        allocated.append(torch.empty(shape, dtype=dtype))
        return allocated[-1]

    pool = pinned.PinnedPool(pin=pin, new_event=lambda: _Event(log), max_buffers=max_buffers)
    return pool, allocated


def test_buffers_are_reused_once_their_copy_finished():
    log = []
    pool, allocated = _pool(log)
    first = torch.arange(6).view(2, 3)
    out = pool.copy(first, torch.device("cpu"))
    assert torch.equal(out, first) and len(allocated) == 1
    # the first copy is still in flight: a second buffer
    second = torch.arange(6, 12).view(3, 2)
    assert torch.equal(pool.copy(second, torch.device("cpu")), second)
    assert len(allocated) == 2
    for slot in pool.slots[(torch.int64, 6)]:
        slot.event.done = True
    third = torch.arange(12, 18).view(6)
    assert torch.equal(pool.copy(third, torch.device("cpu")), third)
    assert len(allocated) == 2 and "wait" not in log  # reused, no host wait
    assert torch.equal(pool.copy(second, torch.device("cpu")), second)  # the other one
    assert len(allocated) == 2 and "wait" not in log
    # both in flight and at the cap: the oldest copy is waited for, nothing allocated
    assert torch.equal(pool.copy(first, torch.device("cpu")), first)
    assert len(allocated) == 2 and log.count("wait") == 1
    # another shape gets its own buffers
    pool.copy(torch.ones(4, dtype=torch.bfloat16), torch.device("cpu"))
    assert len(allocated) == 3 and allocated[-1].dtype == torch.bfloat16


def test_the_staged_bytes_are_the_source_even_if_it_changes_later():
    pool, _ = _pool([])
    source = torch.arange(4.0)
    out = pool.copy(source, torch.device("cpu"))
    source.zero_()
    assert torch.equal(out, torch.arange(4.0))


def test_cpu_devices_and_device_tensors_take_the_plain_path(monkeypatch):
    monkeypatch.setattr(pinned, "_POOL", None)
    tensor = torch.arange(3)
    assert pinned.to_device(tensor, "cpu") is tensor
    assert pinned._POOL is None  # no pool (and no pinning) off CUDA


def test_microbatch_copies_go_through_the_pool():
    """The model's, the fused loss's and the runtime's host-to-device copies of a
    microbatch's tensors use to_device (none is a bare non_blocking .to from pageable
    memory)."""
    for path in ("odc_pp/megatron/model.py", "odc_pp/megatron/packed_attention.py",
                 "odc_pp/megatron/linear_cross_entropy.py", "odc_pp/runtime/runtime.py"):
        text = (ROOT / path).read_text()
        assert "non_blocking=True" not in text, path
        assert "to_device(" in text, path
