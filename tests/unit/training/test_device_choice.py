"""One owner of the CUDA device (``local_device``), ``device_id`` for eager NCCL
communicators, and the fallback from CUDA IPC to the collective path. CUDA and
torch.distributed are mocked: no GPU, no process group."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from odc_pp.training import distributed
from odc_pp.training.distributed import DistEnv, init_distributed, local_device


@pytest.mark.parametrize("count,local_rank,expected", [(1, 3, 0), (8, 3, 3), (4, 6, 2)])
def test_local_device_is_local_rank_modulo_the_visible_devices(monkeypatch, count,
                                                               local_rank, expected):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    assert local_device(local_rank) == torch.device("cuda", expected)


def test_local_device_without_a_visible_gpu_says_so(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(RuntimeError, match="no CUDA device is visible"):
        local_device(0)


def test_init_distributed_binds_the_one_visible_device_eagerly(monkeypatch):
    """SLURM --gpus-per-task=1: LOCAL_RANK=3 but one visible GPU -> cuda:0, passed to
    init_process_group as device_id (NCCL then creates communicators eagerly)."""
    calls = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.update(set=device))
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: calls.update(init=kw))
    device = init_distributed(DistEnv(rank=3, world_size=4, local_rank=3,
                                      local_world_size=4), timeout_minutes=1)
    assert device == torch.device("cuda", 0) and calls["set"] == device
    assert calls["init"]["device_id"] == device
    assert calls["init"]["backend"] == "cpu:gloo,cuda:nccl"


def test_init_distributed_on_cpu_passes_no_device(monkeypatch):
    calls = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: calls.update(kw))
    assert init_distributed(DistEnv(rank=0, world_size=1, local_rank=0, local_world_size=1),
                            timeout_minutes=1) == torch.device("cpu")
    assert "device_id" not in calls and calls["backend"] == "gloo"


def _args(dp_mode):
    checked = []
    parallel = SimpleNamespace(dp_mode=dp_mode)
    args = SimpleNamespace(parallel=parallel)
    args.data_parallel_size = lambda world, local: checked.append(parallel.dp_mode)
    return args, checked


def _topo(rank=0):
    return SimpleNamespace(device=torch.device("cuda", 0), dp=2, dp_group="dp",
                           world_size=4, rank=rank)


def _gather_from(answers):
    def all_gather_object(out, value, group=None):
        out[:] = answers
    return all_gather_object


def test_no_peer_access_falls_back_to_the_collective_path_with_a_message(monkeypatch,
                                                                           capsys):
    from odc_pp.training.components import fall_back_without_cuda_ipc

    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "all_gather_object",
                        _gather_from([None, "group rank 1: cuda:1 has no peer access"]))
    args, checked = _args("odc")
    message = fall_back_without_cuda_ipc(args, _topo(), local_world_size=4,
                                         check=lambda group, device: None)
    assert args.parallel.dp_mode == "collective" and checked == ["collective"]
    assert "falling back to --dp-mode collective" in message and "no peer access" in message
    assert "pretrain_gpt.py: --dp-mode odc needs CUDA IPC" in capsys.readouterr().out


def test_peer_access_everywhere_keeps_odc(monkeypatch):
    from odc_pp.training.components import fall_back_without_cuda_ipc

    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "all_gather_object", _gather_from([None, None]))
    args, _ = _args("odc")
    assert fall_back_without_cuda_ipc(args, _topo(), local_world_size=4,
                                      check=lambda group, device: None) is None
    assert args.parallel.dp_mode == "odc"


def test_hierarchical_without_ipc_names_the_flag(monkeypatch):
    from odc_pp.training.components import fall_back_without_cuda_ipc

    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "all_gather_object", _gather_from(["not visible", None]))
    args, _ = _args("hierarchical")
    with pytest.raises(ValueError, match="--dp-mode hierarchical.*--dp-mode collective"):
        fall_back_without_cuda_ipc(args, _topo(), local_world_size=4,
                                   check=lambda group, device: "not visible")


def test_topology_groups_follow_the_layout():
    groups = distributed.topology_groups(pp=2, tp=2, dp=2)
    assert groups["tp"][:2] == [[0, 1], [2, 3]]
    assert groups["pp"][:2] == [[0, 2], [1, 3]]
    assert groups["dp"][:2] == [[0, 4], [1, 5]]
