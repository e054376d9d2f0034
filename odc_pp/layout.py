"""The parallel layout of a job, resolved once: sizes, the data-parallel mode, the rank
order and the members of every process group (torch-free).

:meth:`ParallelLayout.resolve` runs every check that depends on the world size and
returns a frozen layout with a typed :class:`DataParallelMode`; what changes the mode
later (the CUDA-IPC fallback of ``--dp-mode odc``) returns a new layout
(:meth:`ParallelLayout.without_cuda_ipc`) and never edits the flags.
``odc_pp.training.distributed.Topology.build`` creates the groups :meth:`ParallelLayout.groups`
lists, every one of them and in that order, and warms them up once.

Rank order (Megatron's): tensor-parallel rank fastest, then context parallel, then
pipeline, then data parallel: ``rank = ((dp_rank * pp + pp_rank) * cp + cp_rank) * tp +
tp_rank``. A stage's tp ranks are consecutive (one node: tensor parallelism needs the
fastest links); the pp stages of one replica follow, so a pipeline's point-to-point
traffic stays inside a node when pp x tp <= GPUs per node; data-parallel groups are
strided: the ranks that hold the same stage and shard in every replica.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Protocol

__all__ = ["DataParallelMode", "ParallelLayout", "layout_rank", "topology_groups"]


class DataParallelMode(str, enum.Enum):
    """``--dp-mode``: how the data-parallel ranks share parameters and gradients."""

    ODC = "odc"
    """One-sided sharding: gathers and scatter-accumulates (docs/design.md)."""
    COLLECTIVE = "collective"
    """All-gather and reduce-scatter collectives over the data-parallel group."""
    HIERARCHICAL = "hierarchical"
    """ODC inside a host, collectives between hosts."""
    DDP = "ddp"
    """Megatron's DDP with the distributed optimizer: replicated parameters, gradients
    reduce-scattered once per minibatch, parameters all-gathered after the step."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, text: str) -> DataParallelMode:
        """The mode ``--dp-mode text`` names; a ValueError naming the flag otherwise."""
        try:
            return cls(text)
        except ValueError:
            raise ValueError(f"--dp-mode {text!r} is not one of "
                             f"{tuple(mode.value for mode in cls)}") from None

    @property
    def is_collective(self) -> bool:
        """Collectives only: no memory is mapped between ranks."""
        return self is DataParallelMode.COLLECTIVE

    @property
    def is_hierarchical(self) -> bool:
        """ODC inside a host, collectives between hosts."""
        return self is DataParallelMode.HIERARCHICAL

    @property
    def is_odc(self) -> bool:
        """Plain one-sided ODC over every data-parallel rank."""
        return self is DataParallelMode.ODC

    @property
    def is_ddp(self) -> bool:
        """Replicated parameters, sharded optimizer state (odc_pp.odc.ddp)."""
        return self is DataParallelMode.DDP

    @property
    def transport(self) -> str:
        """The transport backend of its groups (odc_pp.odc.primitives.TransportConfig)."""
        return "collective" if self.is_collective or self.is_ddp else "odc"


class ParallelFlags(Protocol):
    """What :meth:`ParallelLayout.resolve` reads (``TrainingArgs.parallel``)."""

    pipeline_model_parallel_size: int
    tensor_model_parallel_size: int
    context_parallel_size: int
    dp_mode: str
    dp_ranks_per_host: int | None


def layout_rank(*, dp_rank: int, pp_rank: int, tp_rank: int, pp: int, tp: int,
                cp: int = 1, cp_rank: int = 0) -> int:
    """``((dp_rank * pp + pp_rank) * cp + cp_rank) * tp + tp_rank``: the one statement of
    the rank order."""
    return ((dp_rank * pp + pp_rank) * cp + cp_rank) * tp + tp_rank


def topology_groups(*, pp: int, tp: int, dp: int, cp: int = 1) -> dict[str, list[list[int]]]:
    """Global ranks of every tp, pp and dp group, and with cp > 1 of every cp and dp x cp
    group (each list in creation order)."""
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


@dataclass(frozen=True, kw_only=True)
class ParallelLayout:
    """Sizes and data-parallel mode of a job; made by :meth:`resolve`."""

    world: int
    """Processes in the job."""
    local_world: int
    """Processes per host (torchrun --nproc-per-node)."""
    tp: int = 1
    """Tensor-parallel size."""
    cp: int = 1
    """Context-parallel size."""
    pp: int = 1
    """Pipeline-parallel size."""
    dp: int = 1
    """Data-parallel size: world / (tp x cp x pp)."""
    mode: DataParallelMode = DataParallelMode.ODC
    """The data-parallel mode the job runs (after the CUDA-IPC fallback)."""
    ranks_per_host: int = 1
    """Hierarchical mode: data-parallel ranks per host (ODC among them); else dp."""
    fallback: str | None = None
    """Why the mode differs from --dp-mode (the CUDA-IPC fallback), or None."""

    @classmethod
    def resolve(cls, parallel: ParallelFlags, world: int,
                local_world: int | None = None) -> ParallelLayout:
        """The layout of ``parallel``'s flags over ``world`` processes (``local_world``
        per host; default: one host), after every check that depends on them; a
        ValueError naming the flags otherwise."""
        pp, tp = parallel.pipeline_model_parallel_size, parallel.tensor_model_parallel_size
        cp = parallel.context_parallel_size
        if world < 1 or world % (pp * tp * cp):
            raise ValueError(f"world size {world} (torchrun --nproc-per-node x --nnodes) "
                             f"is not divisible by --pipeline-model-parallel-size {pp} x "
                             f"--tensor-model-parallel-size {tp} x "
                             f"--context-parallel-size {cp}")
        dp = world // (pp * tp * cp)
        mode = DataParallelMode.parse(parallel.dp_mode)
        local_world = local_world or world
        per_host = dp
        if parallel.dp_ranks_per_host is not None and (
                parallel.dp_ranks_per_host < 1 or not mode.is_hierarchical):
            raise ValueError("--dp-ranks-per-host needs --dp-mode hierarchical and must be "
                             ">= 1")
        if mode.is_hierarchical and cp > 1:
            raise ValueError(f"--context-parallel-size {cp} needs --dp-mode odc or "
                             f"collective (the gradients are summed over dp x cp)")
        if mode.is_hierarchical:
            per_host = parallel.dp_ranks_per_host or max(1, local_world // (pp * tp))
            if dp % per_host:
                raise ValueError(f"--dp-ranks-per-host {per_host} (default: processes per "
                                 f"host / (pp x tp)) does not divide the data-parallel size "
                                 f"{dp}")
        return cls(world=world, local_world=local_world, tp=tp, cp=cp, pp=pp, dp=dp,
                   mode=mode, ranks_per_host=per_host)

    def without_cuda_ipc(self, problem: str) -> ParallelLayout:
        """The layout when the data-parallel ranks cannot map each other's GPU memory
        (``problem`` says why): odc falls back to collective; hierarchical, which needs
        it, is a ValueError naming the flag."""
        if self.mode.is_hierarchical:
            raise ValueError(f"--dp-mode hierarchical maps the GPU memory of a host's "
                             f"data-parallel ranks, which is not possible here ({problem}); "
                             f"use --dp-mode collective")
        if self.mode.transport == "collective":
            return self
        return replace(self, mode=DataParallelMode.COLLECTIVE, fallback=(
            f"--dp-mode odc needs CUDA IPC between the data-parallel ranks, which is not "
            f"possible here ({problem}): falling back to --dp-mode collective "
            f"(all-gather / reduce-scatter over NCCL)"))

    def folded_context(self) -> ParallelLayout:
        """The same world with context parallelism folded into data parallelism (cp = 1,
        dp x cp replicas): one cp rank's memory (the dry run) is such a rank's."""
        if self.cp == 1:
            return self
        return replace(self, dp=self.dp * self.cp, cp=1,
                       ranks_per_host=self.ranks_per_host * self.cp)

    def rank(self, *, dp_rank: int, pp_rank: int, tp_rank: int = 0, cp_rank: int = 0) -> int:
        """The global rank at these coordinates."""
        return layout_rank(dp_rank=dp_rank, pp_rank=pp_rank, tp_rank=tp_rank, pp=self.pp,
                           tp=self.tp, cp=self.cp, cp_rank=cp_rank)

    def coordinates(self, rank: int) -> tuple[int, int, int, int]:
        """(tp_rank, cp_rank, pp_rank, dp_rank) of global ``rank``."""
        tp, cp, pp = self.tp, self.cp, self.pp
        return rank % tp, rank // tp % cp, rank // (tp * cp) % pp, rank // (tp * cp * pp)

    def groups(self, *, tied_last_stage: int | None = None) -> dict[str, list[list[int]]]:
        """Members of every group the job makes, by kind, each list in creation order:
        tp, pp, dp (and cp, dp-cp with cp > 1); every rank alone (self: megatron's
        groups of one, :func:`odc_pp.megatron.compat.process_group_collection`); hierarchical mode's dp-intra, dp-inter
        and norm groups; and with ``tied_last_stage`` (the pipeline rank of a model's
        last stage, whose output layer is tied to the first stage's embedding) the tied
        groups. Every rank creates every group, in this order."""
        groups = topology_groups(pp=self.pp, tp=self.tp, dp=self.dp, cp=self.cp)
        groups["self"] = [[rank] for rank in range(self.world)]
        if self.mode.is_hierarchical:
            groups.update(self._hierarchical_groups())
        if tied_last_stage is not None:
            groups["tied"] = self._tied_groups(tied_last_stage)
        return groups

    def _hierarchical_groups(self) -> dict[str, list[list[int]]]:
        """One host's data-parallel ranks (dp-intra), the same slot on every host
        (dp-inter), and per host every stage's ranks: one model copy, the ranks of the
        gradient norm (norm)."""
        per_host, hosts = self.ranks_per_host, self.dp // self.ranks_per_host
        intra, inter = [], []
        for stage in range(self.pp):
            for tp_rank in range(self.tp):
                members = [self.rank(dp_rank=replica, pp_rank=stage, tp_rank=tp_rank)
                           for replica in range(self.dp)]
                intra += [members[host * per_host:(host + 1) * per_host]
                          for host in range(hosts)]
                inter += [members[slot::per_host] for slot in range(per_host)]
        norm = [[self.rank(dp_rank=replica, pp_rank=stage, tp_rank=tp_rank)
                 for replica in range(host * per_host, (host + 1) * per_host)
                 for stage in range(self.pp) for tp_rank in range(self.tp)]
                for host in range(hosts)]
        return {"dp-intra": intra, "dp-inter": inter, "norm": norm}

    def _tied_groups(self, last_stage: int) -> list[list[int]]:
        """Per tp rank and host (hierarchical; else all data-parallel ranks): the ranks
        of the first and the last stage, every cp rank of them."""
        per_host = self.ranks_per_host
        return [sorted({self.rank(dp_rank=replica, pp_rank=stage, tp_rank=tp_rank,
                                  cp_rank=cp_rank)
                        for replica in range(host * per_host, (host + 1) * per_host)
                        for stage in (0, last_stage) for cp_rank in range(self.cp)})
                for tp_rank in range(self.tp) for host in range(self.dp // per_host)]
