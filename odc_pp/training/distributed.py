"""torchrun environment, the process groups of a :class:`~odc_pp.layout.ParallelLayout`
and failure handling.

The layout (rank order, every group's members) is :mod:`odc_pp.layout`'s; a pipeline is
the ranks of one replica with the same tp (and cp) rank; under tensor or context
parallelism each such rank runs its own pipeline of the same schedule, and gradients are
summed over the dp x cp ranks of a stage and tp rank (``grad_group``, Megatron's
``dp_cp``). :meth:`Topology.build` is the one place process groups are made.

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

from torch.distributed import ProcessGroup

from ..layout import DataParallelMode, ParallelLayout
from ..runtime.p2p_channels import Communicator, PipelineChannels, create_pipeline_channels
from ..runtime.warmup import warm_up
from .launch_env import DistEnv, read_env

__all__ = ["DistEnv", "Topology", "read_env", "init_distributed", "elastic_restart_store",
           "local_device", "warm_up_topology", "all_ranks_true",
           "standalone_process_groups"]


@dataclass(kw_only=True)
class Topology:
    """This rank's place in the layout and its process groups (made by :meth:`build`)."""

    rank: int
    layout: ParallelLayout
    """Sizes and data-parallel mode (resolved once: :meth:`ParallelLayout.resolve`)."""
    device: torch.device
    pp_rank: int = 0
    dp_rank: int = 0
    tp_rank: int = 0
    cp_rank: int = 0
    pp_group: ProcessGroup | None = None
    """This replica's pipeline ranks (same tp and cp rank)."""
    pp_ranks: list[int] = field(default_factory=list)
    dp_group: ProcessGroup | None = None
    """The ranks holding the same stage and shard in every replica."""
    dp_ranks: list[int] = field(default_factory=list)
    tp_group: ProcessGroup | None = None
    """This stage's tensor-parallel ranks (None: tp = 1)."""
    tp_ranks: list[int] = field(default_factory=list)
    cp_group: ProcessGroup | None = None
    """This stage's context-parallel ranks (None: cp = 1)."""
    cp_ranks: list[int] = field(default_factory=list)
    grad_group: ProcessGroup | None = None
    """The ranks whose gradients are summed: dp x cp (None: cp = 1, ``dp_group``)."""
    grad_ranks: list[int] = field(default_factory=list)
    dp_intra_group: ProcessGroup | None = None
    """Hierarchical mode: this host's data-parallel ranks (ODC among them)."""
    dp_inter_group: ProcessGroup | None = None
    """Hierarchical mode: the ranks of this slot on every host (collectives)."""
    norm_group: ProcessGroup | None = None
    """The ranks owning disjoint pieces of the gradient, whose norm is one: all ranks, or
    with hierarchical mode one host's ranks of every stage (one model copy)."""
    tied_group: ProcessGroup | None = None
    """A model whose output layer is tied to the embedding of another stage: this rank's
    first- and last-stage data-parallel ranks (None: not tied, or not such a rank)."""
    self_group: ProcessGroup | None = None
    """This rank alone: megatron's pp, cp, embd and dp groups (:attr:`megatron_groups`)."""
    timeout_s: float | None = None
    """Every group's timeout (--distributed-timeout-minutes; None: torch's default)."""
    pp_channels: PipelineChannels | None = None
    """This replica's point-to-point channels (one group per direction between
    neighbouring stages)."""
    communicators: list[Communicator] = field(default_factory=list)
    """This rank's groups, for :func:`warm_up_topology`."""

    @property
    def world_size(self) -> int:
        return self.layout.world

    @property
    def pp(self) -> int:
        return self.layout.pp

    @property
    def dp(self) -> int:
        return self.layout.dp

    @property
    def tp(self) -> int:
        return self.layout.tp

    @property
    def cp(self) -> int:
        return self.layout.cp

    @property
    def dp_mode(self) -> DataParallelMode:
        return self.layout.mode

    @property
    def megatron_groups(self):
        """megatron's ProcessGroupCollection for this rank's chunks: its tp group and,
        for every other group megatron sees, this rank alone (no group is made)."""
        from odc_pp.megatron.compat import process_group_collection

        return process_group_collection(self.self_group, tp=self.tp_group)

    @property
    def gradient_group(self) -> ProcessGroup | None:
        """The group gradients are summed over: dp x cp, or the dp group (cp = 1)."""
        return self.grad_group if self.cp > 1 else self.dp_group

    def global_rank(self, *, dp_rank: int, pp_rank: int, tp_rank: int = 0,
                    cp_rank: int | None = None) -> int:
        """The global rank at these coordinates; ``cp_rank`` None: this rank's."""
        return self.layout.rank(dp_rank=dp_rank, pp_rank=pp_rank, tp_rank=tp_rank,
                                cp_rank=self.cp_rank if cp_rank is None else cp_rank)

    @classmethod
    def build(cls, rank: int, layout: ParallelLayout, device: torch.device, *,
              tied_last_stage: int | None = None, timeout_s: float | None = None
              ) -> Topology:
        """Create every group of ``layout.groups(tied_last_stage=...)`` and the pipelines'
        point-to-point channels, each with ``timeout_s`` (collective: all ranks call it,
        with the same layout). Warm them up with :func:`warm_up_topology` before any
        other use. Training calls :meth:`for_job`."""
        tp_rank, cp_rank, pp_rank, dp_rank = layout.coordinates(rank)
        topo = cls(rank=rank, layout=layout, device=device, tp_rank=tp_rank,
                   cp_rank=cp_rank, pp_rank=pp_rank, dp_rank=dp_rank, cp_ranks=[rank],
                   norm_group=dist.group.WORLD, timeout_s=timeout_s,
                   communicators=[Communicator(ranks=tuple(range(layout.world)),
                                               kind="world", group=dist.group.WORLD)])
        groups = layout.groups(tied_last_stage=tied_last_stage)
        for kind, members in groups.items():
            for ranks in members:
                group = topo.new_group(ranks) if kind != "tp" or layout.tp > 1 else None
                if rank in ranks:
                    topo._keep(kind, group, ranks)
        topo.pp_channels = create_pipeline_channels(groups["pp"], timeout=topo.timeout)
        topo.communicators += topo.pp_channels.communicators()
        return topo

    @classmethod
    def for_job(cls, job, rank: int, device: torch.device) -> Topology:
        """The topology of a resolved :class:`~odc_pp.training.job.Job` on ``rank``: its
        layout's groups (the tied ones where the model ties across stages), each with the
        job's timeout."""
        return cls.build(rank, job.layout, device, tied_last_stage=job.tied_last_stage,
                         timeout_s=job.timeout_s)

    @property
    def timeout(self) -> datetime.timedelta | None:
        """:attr:`timeout_s` as ``new_group`` takes it."""
        return None if self.timeout_s is None else datetime.timedelta(seconds=self.timeout_s)

    def new_group(self, ranks: list[int]) -> ProcessGroup:
        """A group of ``ranks`` with the topology's timeout (collective over the world)."""
        return dist.new_group(ranks, timeout=self.timeout)

    def _keep(self, kind: str, group: ProcessGroup | None, ranks: list[int]) -> None:
        """This rank's group of ``kind`` (one of ParallelLayout.groups' kinds)."""
        field_of = {"tp": "tp", "pp": "pp", "dp": "dp", "cp": "cp", "dp-cp": "grad",
                    "dp-intra": "dp_intra", "dp-inter": "dp_inter", "norm": "norm",
                    "tied": "tied", "self": "self"}[kind]
        setattr(self, f"{field_of}_group", group)
        if hasattr(self, f"{field_of}_ranks"):
            setattr(self, f"{field_of}_ranks", ranks)
        if group is not None:
            self.communicators.append(Communicator(ranks=tuple(sorted(ranks)), kind=kind,
                                                   group=group))


def local_device(local_rank: int) -> torch.device:
    """The one owner of this process's CUDA device: ``local_rank % device_count()``.
    Where each process sees one GPU (SLURM ``--gpus-per-task=1``, Kubernetes,
    ``CUDA_VISIBLE_DEVICES`` per rank) that is ``cuda:0`` whatever LOCAL_RANK says."""
    count = torch.cuda.device_count()
    if count < 1:
        raise RuntimeError("no CUDA device is visible to this process")
    return torch.device("cuda", local_rank % count)


def init_distributed(env: DistEnv, *, timeout_minutes: float,
                     backend: str = "nccl") -> torch.device:
    """gloo on CPU, nccl on GPU (:func:`local_device`); every collective times out. On
    GPU the device goes to ``init_process_group`` as ``device_id`` (torch >= 2.3), so
    NCCL creates each group's communicator eagerly. ``backend`` (Megatron's
    ``--distributed-backend``) ``gloo``: gloo for CUDA tensors too, e.g. for ranks that
    share one GPU, which NCCL refuses (the data-parallel transport stays CUDA IPC)."""
    extra = {}
    if torch.cuda.is_available():
        device = local_device(env.local_rank)
        torch.cuda.set_device(device)
        if backend != "gloo":
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
    timeout = datetime.timedelta(minutes=timeout_minutes)
    if not dist.is_initialized():
        store = elastic_restart_store(timeout)
        if store is not None:
            extra["store"] = store
        dist.init_process_group(backend=backend, rank=env.rank, world_size=env.world_size,
                                timeout=timeout, **extra)
    return device


def elastic_restart_store(timeout: datetime.timedelta):
    """On a torchelastic restart (``TORCHELASTIC_RESTART_COUNT`` > 0) whose workers use the
    agent's store (``TORCHELASTIC_USE_AGENT_STORE``): that store under a prefix of its own
    restart, else None (``init_process_group`` connects as usual).

    Why: torchrun's c10d rendezvous shares one TCPStore server across restarts, and the
    workers' client does not prefix it per attempt (torch 2.13's ``_create_c10d_store``
    assumes a new store per retry), so a restarted rank could read the gloo address a
    rank of the killed round published under the same key, connect to a dead port and
    fail in ``connectFullMesh`` ("Connection refused"): tests/e2e/training/
    test_elastic_restart.py did, in most runs."""
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    if restart == 0 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False, timeout=timeout)
    return dist.PrefixStore(f"odc-pp/elastic_restart_{restart}", store)


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


def all_ranks_true(flag: bool) -> bool:
    """Collective over the world: whether ``flag`` is true on every rank (a MIN all-reduce
    of a CPU tensor; gloo)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return bool(flag)
    tensor = torch.tensor([1 if flag else 0], dtype=torch.int32)
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return bool(tensor.item())


def standalone_process_groups(*, tp=None):
    """megatron's ProcessGroupCollection for chunks built outside a training job (tests,
    benchmarks, tools): this process alone for every group but the tensor-parallel ones
    (``tp``: a group, or None). Collective over the world: every rank makes every rank's
    group of one, as ``dist.new_group`` requires. Training uses
    :attr:`Topology.megatron_groups` (made and warmed with the topology)."""
    from odc_pp.megatron.compat import process_group_collection

    if not dist.is_initialized():
        raise ValueError("initialise torch.distributed (e.g. gloo) before building the model")
    own = None
    for rank in range(dist.get_world_size()):
        group = dist.new_group([rank])
        if rank == dist.get_rank():
            own = group
    return process_group_collection(own, tp=tp)
