"""Heartbeats name the rank that stopped responding (odc_pp.runtime.liveness): two
ranks' heartbeats in one in-memory store, a fake clock, and a "sleep" during which only
the live rank beats."""

from __future__ import annotations

import torch.distributed as dist

from odc_pp.layout import ParallelLayout
from odc_pp.runtime.liveness import (CONFIRM_PERIODS, Heartbeat, is_timeout,
                                     name_stalled_peers, rank_words)


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _ranks(world: int, clock: _Clock, store=None) -> list[Heartbeat]:
    store = store if store is not None else dist.HashStore()
    return [Heartbeat(store, rank=r, world_size=world, timeout_s=8.0, clock=clock)
            for r in range(world)]


def test_period_is_an_eighth_of_the_timeout_within_bounds():
    store = dist.HashStore()
    assert Heartbeat(store, rank=0, world_size=1, timeout_s=8.0).period_s == 1.0
    assert Heartbeat(store, rank=0, world_size=1, timeout_s=0.5).period_s == 0.2
    assert Heartbeat(store, rank=0, world_size=1, timeout_s=1800).period_s == 5.0


def test_the_rank_that_stopped_beating_is_stalled():
    clock = _Clock()
    ranks = _ranks(3, clock)
    for heartbeat in ranks:
        heartbeat.beat()
    clock.now += 7.0  # rank 2 stops here; ranks 0 and 1 keep beating

    def sleep(seconds):
        assert seconds == CONFIRM_PERIODS * ranks[0].period_s
        clock.now += seconds
        ranks[1].beat()

    stalled = ranks[0].stalled(sleep=sleep)
    assert [(s.rank, s.age_s) for s in stalled] == [(2, 7.0 + CONFIRM_PERIODS)]


def test_a_rank_that_never_beat_is_stalled_and_all_live_is_none():
    clock = _Clock()
    ranks = _ranks(2, clock)
    ranks[0].beat()
    stalled = ranks[0].stalled(sleep=lambda s: None)
    assert [(s.rank, s.age_s) for s in stalled] == [(1, None)]
    ranks[1].beat()
    assert ranks[0].stalled(sleep=lambda s: ranks[1].beat()) == []


def test_timeouts_are_recognised_and_others_are_not():
    gloo = RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting "
                        "6000ms for recv operation to complete")
    assert is_timeout(gloo)
    assert is_timeout(TimeoutError("pipeline rank 0: RECV_F0.0 did not complete"))
    try:
        try:
            raise gloo
        except RuntimeError as inner:
            raise ValueError("wrapped") from inner
    except ValueError as outer:
        assert is_timeout(outer)
    assert not is_timeout(RuntimeError("Connection closed by peer"))
    assert not is_timeout(OSError(28, "No space left on device"))


def test_a_timeout_becomes_an_error_naming_the_stopped_rank():
    layout = ParallelLayout(world=2, local_world=2, pp=1, dp=2, tp=1, cp=1)
    clock = _Clock()
    ranks = _ranks(2, clock)
    for heartbeat in ranks:
        heartbeat.describe = lambda rank: rank_words(layout, rank)
        heartbeat.beat()
    ranks[0]._run = lambda: None  # no thread: the test drives the beats
    ranks[0].period_s = 0.01  # the real sleep of report() is short
    clock.now += 6.0
    error = RuntimeError("[gloo] Timed out waiting 6000ms for send operation to complete")
    named = name_stalled_peers(error, rank=0, heartbeat=ranks[0])
    assert isinstance(named, TimeoutError) and named.__cause__ is error
    assert str(named).startswith("rank 0: a wait on peers timed out after 8 s: rank 1 "
                                 "(pp rank 0, dp rank 1) stopped responding (last "
                                 "heartbeat 6.0 s ago)")
    assert "Timed out waiting 6000ms" in str(named)
    other = OSError(28, "No space left on device")
    assert name_stalled_peers(other, rank=0, heartbeat=ranks[0]) is other


def test_rank_words_name_the_parallel_dimensions():
    layout = ParallelLayout(world=8, local_world=8, pp=2, dp=1, tp=2, cp=2)
    assert rank_words(layout, 5) == "rank 5 (tp rank 1, cp rank 0, pp rank 1, dp rank 0)"
