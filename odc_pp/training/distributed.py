"""torchrun environment, process-group layout and failure handling.

Layout: ``rank = dp_rank * pp + pp_rank``. The pp stages of one data-parallel replica are
consecutive ranks (``[0, 1]``, ``[2, 3]`` for pp=2, dp=2), so a pipeline's point-to-point
traffic stays inside a node when pp <= GPUs per node; data-parallel groups are strided
(``[0, 2]``, ``[1, 3]``): the ranks that hold the same stage in every replica.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..runtime.p2p_channels import create_pipeline_channels

__all__ = ["DistEnv", "Topology", "read_env", "init_distributed", "build_topology"]


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int


def read_env() -> DistEnv:
    """The torchrun variables (single process when they are absent)."""
    return DistEnv(rank=int(os.environ.get("RANK", 0)),
                   world_size=int(os.environ.get("WORLD_SIZE", 1)),
                   local_rank=int(os.environ.get("LOCAL_RANK", 0)),
                   local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", 1)))


@dataclass
class Topology:
    rank: int
    world_size: int
    pp: int
    dp: int
    pp_rank: int
    dp_rank: int
    pp_group: object
    """torch.distributed group of this replica's pipeline ranks."""
    dp_group: object
    """torch.distributed group of the ranks holding the same stage in every replica."""
    pp_ranks: list[int]
    dp_ranks: list[int]
    device: torch.device
    pp_channels: object = None
    """This replica's point-to-point channels (one group per direction between
    neighbouring stages, :class:`odc_pp.runtime.p2p_channels.PipelineChannels`)."""

    @property
    def is_first_stage_rank(self) -> bool:
        return self.pp_rank == 0


def init_distributed(env: DistEnv, *, timeout_minutes: float) -> torch.device:
    """gloo on CPU, nccl on GPU (one per local rank); every collective times out."""
    if torch.cuda.is_available():
        device = torch.device("cuda", env.local_rank)
        torch.cuda.set_device(device)
        backend = "cpu:gloo,cuda:nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, rank=env.rank, world_size=env.world_size,
                                timeout=datetime.timedelta(minutes=timeout_minutes))
    return device


def build_topology(env: DistEnv, pp: int, device: torch.device) -> Topology:
    """Create every pp and dp group (collective: all ranks call it in the same order)."""
    dp = env.world_size // pp
    pp_rank, dp_rank = env.rank % pp, env.rank // pp
    my_pp = my_dp = None
    pp_ranks = dp_ranks = []
    for replica in range(dp):
        ranks = [replica * pp + stage for stage in range(pp)]
        group = dist.new_group(ranks)
        if replica == dp_rank:
            my_pp, pp_ranks = group, ranks
    for stage in range(pp):
        ranks = [replica * pp + stage for replica in range(dp)]
        group = dist.new_group(ranks)
        if stage == pp_rank:
            my_dp, dp_ranks = group, ranks
    channels = create_pipeline_channels([[replica * pp + stage for stage in range(pp)]
                                         for replica in range(dp)])
    return Topology(rank=env.rank, world_size=env.world_size, pp=pp, dp=dp, pp_rank=pp_rank,
                    dp_rank=dp_rank, pp_group=my_pp, dp_group=my_dp, pp_ranks=pp_ranks,
                    dp_ranks=dp_ranks, device=device, pp_channels=channels)
