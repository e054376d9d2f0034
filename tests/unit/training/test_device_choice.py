"""One owner of the CUDA device (``local_device``), ``device_id`` for eager NCCL
communicators, and the fallback from CUDA IPC to the collective path. CUDA and
torch.distributed are mocked: no GPU, no process group."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from odc_pp.layout import DataParallelMode, ParallelLayout, topology_groups
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


def _one_visible_gpu(monkeypatch) -> dict:
    """CUDA available with one visible device; set_device and init_process_group record
    their arguments in the returned dict."""
    calls = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.update(set=device))
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: calls.update(init=kw))
    return calls


def test_init_distributed_binds_the_one_visible_device_eagerly(monkeypatch):
    """SLURM --gpus-per-task=1: LOCAL_RANK=3 but one visible GPU -> cuda:0, passed to
    init_process_group as device_id (NCCL then creates communicators eagerly)."""
    calls = _one_visible_gpu(monkeypatch)
    device = init_distributed(DistEnv(rank=3, world_size=4, local_rank=3,
                                      local_world_size=4), timeout_minutes=1)
    assert device == torch.device("cuda", 0) and calls["set"] == device
    assert calls["init"]["device_id"] == device
    assert calls["init"]["backend"] == "cpu:gloo,cuda:nccl"


def test_distributed_backend_gloo_runs_cuda_tensors_on_gloo(monkeypatch):
    """--distributed-backend gloo (Megatron's flag) on GPUs: one gloo backend for CPU and
    CUDA tensors and no device_id (which would make NCCL communicators), e.g. for two
    ranks sharing one GPU."""
    calls = _one_visible_gpu(monkeypatch)
    device = init_distributed(DistEnv(rank=1, world_size=2, local_rank=1,
                                      local_world_size=2), timeout_minutes=1, backend="gloo")
    assert device == torch.device("cuda", 0)
    assert calls["init"]["backend"] == "gloo" and "device_id" not in calls["init"]


def test_init_distributed_on_cpu_passes_no_device(monkeypatch):
    calls = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: calls.update(kw))
    assert init_distributed(DistEnv(rank=0, world_size=1, local_rank=0, local_world_size=1),
                            timeout_minutes=1) == torch.device("cpu")
    assert "device_id" not in calls and calls["backend"] == "gloo"


def _topo(dp_mode, rank=0):
    layout = ParallelLayout.resolve(SimpleNamespace(
        pipeline_model_parallel_size=2, tensor_model_parallel_size=1,
        context_parallel_size=1, dp_mode=dp_mode, dp_ranks_per_host=None), 4)
    return SimpleNamespace(device=torch.device("cuda", 0), dp=2, dp_group="dp",
                           world_size=4, rank=rank, layout=layout)


def _gather_from(answers):
    def all_gather_object(out, value, group=None):
        out[:] = answers
    return all_gather_object


def test_no_peer_access_falls_back_to_the_collective_path_with_a_message(monkeypatch,
                                                                           capsys):
    """The fallback is a new layout (the flags are not edited): collective, saying why."""
    from odc_pp.training.components import cuda_ipc_layout

    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "all_gather_object", _gather_from([None, "no peer access"]))
    topo = _topo("odc")
    layout = cuda_ipc_layout(topo, check=lambda group, device: None)
    assert layout.mode is DataParallelMode.COLLECTIVE and topo.layout.mode.is_odc
    assert "falling back to --dp-mode collective" in layout.fallback
    assert "no peer access" in layout.fallback
    assert "pretrain_gpt.py: --dp-mode odc needs CUDA IPC" in capsys.readouterr().out


def test_peer_access_everywhere_keeps_odc(monkeypatch):
    from odc_pp.training.components import cuda_ipc_layout

    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "all_gather_object", _gather_from([None, None]))
    topo = _topo("odc")
    assert cuda_ipc_layout(topo, check=lambda group, device: None) is topo.layout


def test_hierarchical_without_ipc_names_the_flag(monkeypatch):
    from odc_pp.training.components import cuda_ipc_layout

    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "all_gather_object", _gather_from(["not visible", None]))
    with pytest.raises(ValueError, match="--dp-mode hierarchical.*--dp-mode collective"):
        cuda_ipc_layout(_topo("hierarchical"), check=lambda group, device: "not visible")


def test_resolved_layout_checks_the_world_once():
    """ParallelLayout.resolve: sizes, the typed mode, and one error naming the flags."""
    flags = SimpleNamespace(pipeline_model_parallel_size=2, tensor_model_parallel_size=2,
                            context_parallel_size=1, dp_mode="hierarchical",
                            dp_ranks_per_host=None)
    layout = ParallelLayout.resolve(flags, 16, 8)
    assert (layout.dp, layout.ranks_per_host, layout.mode) == (4, 2,
                                                               DataParallelMode.HIERARCHICAL)
    assert layout.coordinates(layout.rank(dp_rank=3, pp_rank=1, tp_rank=1)) == (1, 0, 1, 3)
    with pytest.raises(ValueError, match="--pipeline-model-parallel-size 2"):
        ParallelLayout.resolve(flags, 6, 6)
    with pytest.raises(ValueError, match="--dp-ranks-per-host 3"):
        ParallelLayout.resolve(SimpleNamespace(**{**vars(flags), "dp_ranks_per_host": 3}),
                               16, 8)
    with pytest.raises(ValueError, match="--dp-mode 'fsdp' is not one of"):
        ParallelLayout.resolve(SimpleNamespace(**{**vars(flags), "dp_mode": "fsdp"}), 16)


def test_hierarchical_and_tied_groups_are_listed_in_one_order():
    """Every group the job makes comes from ParallelLayout.groups (Topology.build makes
    them, in this order, on every rank): hierarchical mode's, and the tied groups."""
    flags = SimpleNamespace(pipeline_model_parallel_size=2, tensor_model_parallel_size=1,
                            context_parallel_size=1, dp_mode="hierarchical",
                            dp_ranks_per_host=2)
    groups = ParallelLayout.resolve(flags, 8, 4).groups(tied_last_stage=1)
    assert groups["dp-intra"] == [[0, 2], [4, 6], [1, 3], [5, 7]]
    assert groups["dp-inter"] == [[0, 4], [2, 6], [1, 5], [3, 7]]
    assert groups["norm"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert groups["tied"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    odc = ParallelLayout.resolve(SimpleNamespace(**{**vars(flags), "dp_mode": "odc",
                                                    "dp_ranks_per_host": None}), 8)
    assert set(odc.groups()) == {"tp", "pp", "dp", "self"}
    assert odc.groups(tied_last_stage=1)["tied"] == [list(range(8))]


def test_topology_groups_follow_the_layout():
    groups = topology_groups(pp=2, tp=2, dp=2)
    assert groups["tp"][:2] == [[0, 1], [2, 3]]
    assert groups["pp"][:2] == [[0, 2], [1, 3]]
    assert groups["dp"][:2] == [[0, 4], [1, 5]]
