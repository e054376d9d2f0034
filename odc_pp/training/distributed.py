"""torchrun environment, process-group layout and failure handling.

Layout (Megatron's): tensor-parallel rank fastest, then context parallel, then pipeline,
then data parallel, ``rank = ((dp_rank * pp + pp_rank) * cp + cp_rank) * tp + tp_rank``
(cp = 1: ``(dp_rank * pp + pp_rank) * tp + tp_rank``). A stage's tp ranks are consecutive
(one node: tensor parallelism needs the fastest links); the pp stages of one replica
follow (``[0, 1]``, ``[2, 3]`` for tp=1, pp=2, dp=2), so a pipeline's point-to-point
traffic stays inside a node when pp x tp <= GPUs per node; data-parallel groups are
strided (``[0, 2]``, ``[1, 3]``): the ranks that hold the same stage and tp shard in every
replica. A pipeline is the ranks of one replica with the same tp rank; under tensor
parallelism each tp rank runs its own pipeline of the same schedule. Context parallelism
(cp > 1): a stage's cp ranks (same tp rank) split the sequence and run the same schedule,
each in its own pipeline; gradients are summed over the dp x cp ranks of a stage and tp
rank (``grad_group``, Megatron's ``dp_cp``).

Communicators: on GPU ``init_process_group`` gets ``device_id`` so NCCL creates them
eagerly, and :func:`warm_up_topology` touches every group once in one global order
before anything else runs on them (docs/nccl_ordering.md).
"""

from __future__ import annotations

import datetime
import inspect
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..runtime.p2p_channels import Communicator, create_pipeline_channels
from ..runtime.warmup import warm_up

__all__ = ["DistEnv", "Topology", "read_env", "init_distributed", "build_topology",
           "layout_rank", "local_device", "topology_groups", "warm_up_topology",
           "all_ranks_true"]


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
    """torch.distributed group of this replica's pipeline ranks (same tp rank)."""
    dp_group: object
    """torch.distributed group of the ranks holding the same stage and tp shard in every
    replica."""
    pp_ranks: list[int]
    dp_ranks: list[int]
    device: torch.device
    pp_channels: object = None
    """This replica's point-to-point channels (one group per direction between
    neighbouring stages, :class:`odc_pp.runtime.p2p_channels.PipelineChannels`)."""
    tp: int = 1
    """Tensor-parallel size."""
    tp_rank: int = 0
    tp_group: object = None
    """torch.distributed group of this stage's tensor-parallel ranks (None: tp = 1)."""
    tp_ranks: list[int] = field(default_factory=list)
    cp: int = 1
    """Context-parallel size."""
    cp_rank: int = 0
    cp_group: object = None
    """torch.distributed group of this stage's context-parallel ranks (None: cp = 1)."""
    cp_ranks: list[int] = field(default_factory=list)
    grad_group: object = None
    """The ranks whose gradients are summed: dp x cp (None: cp = 1, ``dp_group``)."""
    grad_ranks: list[int] = field(default_factory=list)
    communicators: list[Communicator] = field(default_factory=list)
    """This rank's groups (tp, cp, pp, dp, dp-cp, channels, world), for
    :func:`warm_up_topology`."""

    @property
    def is_first_stage_rank(self) -> bool:
        return self.pp_rank == 0

    @property
    def gradient_group(self):
        """The group gradients are summed over: dp x cp, or the dp group (cp = 1)."""
        return self.grad_group if self.cp > 1 else self.dp_group

    def global_rank(self, *, dp_rank: int, pp_rank: int, tp_rank: int = 0,
                    cp_rank: int | None = None) -> int:
        """The global rank at these coordinates (the layout of the module docstring);
        ``cp_rank`` None: this rank's."""
        return layout_rank(dp_rank=dp_rank, pp_rank=pp_rank, tp_rank=tp_rank, pp=self.pp,
                           tp=self.tp, cp=self.cp,
                           cp_rank=self.cp_rank if cp_rank is None else cp_rank)


def layout_rank(*, dp_rank: int, pp_rank: int, tp_rank: int, pp: int, tp: int,
                cp: int = 1, cp_rank: int = 0) -> int:
    """``((dp_rank * pp + pp_rank) * cp + cp_rank) * tp + tp_rank``: the one statement of
    the layout."""
    return ((dp_rank * pp + pp_rank) * cp + cp_rank) * tp + tp_rank


def local_device(local_rank: int) -> torch.device:
    """The one owner of this process's CUDA device: ``local_rank % device_count()``.
    Where each process sees one GPU (SLURM ``--gpus-per-task=1``, Kubernetes,
    ``CUDA_VISIBLE_DEVICES`` per rank) that is ``cuda:0`` whatever LOCAL_RANK says."""
    count = torch.cuda.device_count()
    if count < 1:
        raise RuntimeError("no CUDA device is visible to this process")
    return torch.device("cuda", local_rank % count)


def init_distributed(env: DistEnv, *, timeout_minutes: float) -> torch.device:
    """gloo on CPU, nccl on GPU (:func:`local_device`); every collective times out. On
    GPU the device goes to ``init_process_group`` as ``device_id`` (torch >= 2.3), so
    NCCL creates each group's communicator eagerly."""
    extra = {}
    if torch.cuda.is_available():
        device = local_device(env.local_rank)
        torch.cuda.set_device(device)
        backend = "cpu:gloo,cuda:nccl"
        parameters = inspect.signature(dist.init_process_group).parameters
        if "device_id" in parameters or any(p.kind is p.VAR_KEYWORD
                                            for p in parameters.values()):
            extra["device_id"] = device
    else:
        device = torch.device("cpu")
        backend = "gloo"
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, rank=env.rank, world_size=env.world_size,
                                timeout=datetime.timedelta(minutes=timeout_minutes),
                                **extra)
    return device


def topology_groups(*, pp: int, tp: int, dp: int, cp: int = 1) -> dict[str, list[list[int]]]:
    """Global ranks of every tp, pp and dp group, and with cp > 1 of every cp and dp x cp
    group (each list in creation order): the layout of the module docstring, without
    torch."""
    def rank_at(d: int, p: int, t: int, c: int = 0) -> int:
        return layout_rank(dp_rank=d, pp_rank=p, tp_rank=t, pp=pp, tp=tp, cp=cp, cp_rank=c)

    cps = range(cp)
    groups = {"tp": [[rank_at(d, p, t, c) for t in range(tp)] for d in range(dp)
                     for p in range(pp) for c in cps],
              "pp": [[rank_at(d, p, t, c) for p in range(pp)] for d in range(dp)
                     for c in cps for t in range(tp)],
              "dp": [[rank_at(d, p, t, c) for d in range(dp)] for p in range(pp)
                     for c in cps for t in range(tp)]}
    if cp > 1:
        groups["cp"] = [[rank_at(d, p, t, c) for c in cps] for d in range(dp)
                        for p in range(pp) for t in range(tp)]
        groups["dp-cp"] = [[rank_at(d, p, t, c) for d in range(dp) for c in cps]
                           for p in range(pp) for t in range(tp)]
    return groups


def warm_up_topology(topo: "Topology", *, timeout_s: float, ops=None,
                     communicators: list[Communicator] | None = None) -> int:
    """Touch every group of ``topo`` (or ``communicators``, groups created later) once,
    in the global warm-up order (collective: all ranks call it before any other
    operation on these groups). ``ops``: the point-to-point backend (default:
    torch.distributed's on ``topo.device``)."""
    if ops is None:
        from ..runtime.p2p import TorchP2POps

        ops = TorchP2POps(topo.device)
    return warm_up(topo.communicators if communicators is None else communicators,
                   ops=ops, rank=topo.rank, timeout_s=timeout_s)


def build_topology(env: DistEnv, pp: int, device: torch.device, *, tp: int = 1,
                   cp: int = 1) -> Topology:
    """Create every tp, cp, pp, dp and dp x cp group and the pipelines' point-to-point
    channels (collective: all ranks call it in the same order)."""
    if env.world_size % (pp * tp * cp):
        raise ValueError(f"world size {env.world_size} is not divisible by "
                         f"--pipeline-model-parallel-size {pp} x "
                         f"--tensor-model-parallel-size {tp} x "
                         f"--context-parallel-size {cp}")
    dp = env.world_size // (pp * tp * cp)
    tp_rank, cp_rank = env.rank % tp, env.rank // tp % cp
    pp_rank, dp_rank = env.rank // (tp * cp) % pp, env.rank // (tp * cp * pp)
    mine = {"cp": (None, [env.rank]), "dp-cp": (None, [])}
    communicators = [Communicator(ranks=tuple(range(env.world_size)), kind="world",
                                  group=dist.group.WORLD)]
    layout = topology_groups(pp=pp, tp=tp, dp=dp, cp=cp)
    for kind, groups in layout.items():
        for ranks in groups:
            group = dist.new_group(ranks) if kind != "tp" or tp > 1 else None
            if env.rank in ranks:
                mine[kind] = (group, ranks)
                if group is not None:
                    communicators.append(Communicator(ranks=tuple(sorted(ranks)),
                                                      kind=kind, group=group))
    channels = create_pipeline_channels(layout["pp"])
    communicators += channels.communicators()
    return Topology(rank=env.rank, world_size=env.world_size, pp=pp, dp=dp, pp_rank=pp_rank,
                    dp_rank=dp_rank, pp_group=mine["pp"][0], dp_group=mine["dp"][0],
                    pp_ranks=mine["pp"][1], dp_ranks=mine["dp"][1], device=device,
                    pp_channels=channels, tp=tp, tp_rank=tp_rank, tp_group=mine["tp"][0],
                    tp_ranks=mine["tp"][1], cp=cp, cp_rank=cp_rank, cp_group=mine["cp"][0],
                    cp_ranks=mine["cp"][1], grad_group=mine["dp-cp"][0],
                    grad_ranks=mine["dp-cp"][1], communicators=communicators)


def all_ranks_true(flag: bool) -> bool:
    """Collective over the world: whether ``flag`` is true on every rank (a MIN all-reduce
    of a CPU tensor; gloo)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return bool(flag)
    tensor = torch.tensor([1 if flag else 0], dtype=torch.int32)
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return bool(tensor.item())
