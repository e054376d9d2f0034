"""odc_pp.training.distributed.elastic_restart_store: a restarted torchelastic worker's
keys go under a prefix of its restart, so a key the killed round wrote is not read."""

import datetime

import torch.distributed as dist

from odc_pp.testing.launch import free_port
from odc_pp.training.distributed import elastic_restart_store

TIMEOUT = datetime.timedelta(seconds=30)


def test_first_attempt_and_no_agent_store_keep_the_default(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    assert elastic_restart_store(TIMEOUT) is None
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE")
    assert elastic_restart_store(TIMEOUT) is None


def test_a_restart_reads_its_own_keys_not_the_killed_rounds(monkeypatch):
    port = free_port()
    agent = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=TIMEOUT)
    agent.set("rank_0", "the killed round's address")  # what a stale key looks like
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    store = elastic_restart_store(TIMEOUT)
    store.set("rank_0", "this round's address")
    assert store.get("rank_0") == b"this round's address"
    assert agent.get("odc-pp/elastic_restart_1/rank_0") == b"this round's address"
    assert agent.get("rank_0") == b"the killed round's address"
