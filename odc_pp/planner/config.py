"""What the planner searches over and returns: the search's inputs (:class:`PlanConfig`),
one configuration (:class:`Candidate`) and its prediction (:class:`Prediction`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from odc_pp.layout import DataParallelMode
from odc_pp.schedule.costs import CostModel
from odc_pp.schedule.generators import family

from .hardware import GB, Hardware, memory_budget_gb
from .inputs import ModelSpec

__all__ = ["PlanConfig", "Candidate", "Prediction", "SCHEDULES", "MEGATRON_SCHEDULES", "GB"]

SCHEDULES = ("1f1b", "interleaved", "zb-h1", "zb-h2", "zbv", "offload")
MEGATRON_SCHEDULES = ("1f1b", "interleaved")


@dataclass(kw_only=True)
class PlanConfig:
    """What to plan for."""

    model: ModelSpec
    """The transformer."""
    cluster: Hardware
    """GPU kind and links."""
    gpus: int
    """GPUs in the job."""
    global_batch: int
    """Samples per optimizer step."""
    lengths: np.ndarray
    """The sample-length distribution (samples are drawn from it)."""
    memory_gb: float | None = None
    """Usable memory per GPU, GB (default: :func:`~.hardware.memory_budget_gb` of
    ``cluster``, the dry run's budget for the same GPU)."""
    tp_sizes: tuple[int, ...] = (1, 2, 4, 8)
    """Tensor-parallel sizes tried (within a node)."""
    schedules: tuple[str, ...] = SCHEDULES
    """Schedule families tried."""
    token_caps: tuple[int, ...] = (1, 2, 4)
    """Packed-row token caps tried, in multiples of the sequence length."""
    dp_modes: tuple[DataParallelMode, ...] = (DataParallelMode.COLLECTIVE, DataParallelMode.ODC)
    """Data-parallel modes tried (--dp-mode strings are accepted)."""
    samples: int = 2
    """Global minibatches drawn to predict each candidate."""
    seed: int = 0
    """Seed of those draws."""
    rank_memory: Callable[[list[str], int], list[float]] | None = None
    """(a candidate's printed flags, GPUs) -> peak bytes per pipeline rank; None: the
    rough estimate of the module docstring (step 5)."""
    workers: int = 1
    """Processes that evaluate the candidates (the result does not depend on it)."""
    flash_attention: bool = True
    """Attention without the ``5 a s / h`` score activations (flash / SDPA kernels)."""
    plan_costs: CostModel | None = None
    """The ``--cost-model`` the training frontend will plan schedules with (None: its
    default, ``CostModel()``); every candidate's schedule is built from it."""
    plan_costs_path: str | None = None
    """That file's path, repeated as ``--cost-model`` in every candidate's flags."""
    memo: dict = field(default_factory=dict, repr=False, compare=False)
    """Not an input: what the search computed once for this config (sampled plans, stage
    times, each candidate's simulated minibatches), shared with the copies ``replace``
    makes; emptied when a copy's timing inputs (model, cluster, job, lengths) differ."""

    def __post_init__(self) -> None:
        self.dp_modes = tuple(DataParallelMode.parse(mode) for mode in self.dp_modes)
        if self.gpus < 1 or self.global_batch < 1 or self.samples < 1:
            raise ValueError("--gpus, --global-batch and --samples must be >= 1")
        if self.workers < 1:
            raise ValueError(f"--jobs must be >= 1, got {self.workers}")
        if len(self.lengths) < 1:
            raise ValueError("the length distribution is empty")
        for name in self.schedules:
            if family(name).searched:
                raise ValueError(f"schedule {name} is re-planned during training; not plannable")

    @property
    def memory_bytes(self) -> float:
        return memory_budget_gb(self.cluster, self.memory_gb) * GB


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One configuration."""

    tp: int
    pp: int
    dp: int
    schedule: str
    dp_mode: DataParallelMode
    """--dp-mode (a string is accepted)."""
    balance: str
    packed: bool
    token_cap: int | None
    """Packed-row cap (None: one sample per microbatch, unpacked)."""
    recompute: bool = False
    cp: int = 1
    """Context-parallel size (each row split over cp ranks, ring attention)."""
    micro_batch: int = 1
    """Samples per unpacked microbatch (--micro-batch-size: rows padded to the longest)."""
    offload_chunks: tuple[int, ...] | None = None
    """--offload-chunks of an offloading family (None: all its chunks); see
    :attr:`offloaded`."""
    keep_sp_input_for_w: bool = False
    """--keep-sp-input-for-w (tp > 1): B keeps W's gathered inputs instead of W
    re-gathering them."""
    uneven: tuple[int, int] | None = None
    """(--decoder-first-pipeline-num-layers, --decoder-last-pipeline-num-layers): lighter
    embedding and loss stages (None: equal stages)."""
    accounted: tuple[bool, bool] = (False, False)
    """(--account-for-embedding-in-pipeline-split, --account-for-loss-in-pipeline-split):
    the embedding / the loss counted as one layer of the split, the first / last virtual
    stage one decoder layer lighter (Megatron's meaning; not with ``uneven``)."""
    chunks: int | None = None
    """--num-model-chunks, model chunks per pipeline rank (None: the family's default);
    see :attr:`num_chunks`."""
    group_size: int | None = None
    """--microbatch-group-size-per-virtual-pipeline-stage of a grouped family (gis,
    offload, interleaved; None: the family's default)."""
    selective_offload: bool = False
    """--selective-offload: offload only the passes whose activations live long enough to
    hide the transfer (PipeOffload's selective strategy)."""
    post_validation: bool = True
    """--enable-optimizer-post-validation where the schedule's iterations overlap
    (:func:`~odc_pp.planner.post_validation.post_validated`); False: a synchronous step."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "dp_mode", DataParallelMode.parse(self.dp_mode))
        fam = family(self.schedule)
        if self.chunks is not None and not fam.accepts_chunks(self.chunks):
            raise ValueError(f"--num-model-chunks {self.chunks}: schedule {self.schedule} "
                             f"takes {fam.min_chunks}..{fam.max_chunks or 'any'}")
        if self.offload_chunks is not None and (
                not fam.offloads or not self.offload_chunks or
                not set(self.offload_chunks) <= set(range(self.num_chunks))):
            raise ValueError(f"--offload-chunks {list(self.offload_chunks)} needs an "
                             f"offloading schedule and chunks in 0..{self.num_chunks - 1}"
                             f" (schedule {self.schedule})")
        if self.group_size is not None and "group_size" not in fam.options:
            raise ValueError(f"--microbatch-group-size-per-virtual-pipeline-stage needs a "
                             f"grouped schedule, not {self.schedule}")
        if self.selective_offload and not fam.offloads:
            raise ValueError(f"--selective-offload needs an offloading schedule, not "
                             f"{self.schedule}")
        if self.keep_sp_input_for_w and self.tp == 1:
            raise ValueError("--keep-sp-input-for-w needs a tensor-parallel size > 1")

    @property
    def num_chunks(self) -> int:
        """Model chunks per pipeline rank (``chunks``, or the family's default)."""
        return self.chunks if self.chunks is not None else family(self.schedule).default_chunks

    @property
    def offloaded(self) -> tuple[int, ...]:
        """The local chunks whose activations go to host memory (empty: none)."""
        fam = family(self.schedule)
        if not fam.offloads:
            return ()
        return tuple(self.offload_chunks) if self.offload_chunks is not None \
            else tuple(range(self.num_chunks))


@dataclass(kw_only=True)
class Prediction:
    """The predicted performance of one candidate."""

    candidate: Candidate
    step_s: float
    tokens_per_s: float
    breakdown: dict[str, float]
    """Seconds per step: compute (busiest rank's own work), bubble (pipeline idle),
    dp_wait (waiting for slower replicas), comm (exposed data-parallel traffic),
    optimizer (a rank's optimizer step over its owned shard)."""
    peak_memory_gb: list[float]
    """Predicted peak per pipeline rank (model state, activations, last rank's logits)."""
    fits: bool
    mfu: float
    flags: list[str] = field(default_factory=list)
    megatron_default: bool = False

    def to_dict(self) -> dict:
        return {"config": vars(self.candidate), "step_s": self.step_s,
                "tokens_per_s": self.tokens_per_s, "breakdown": self.breakdown,
                "peak_memory_gb": self.peak_memory_gb, "fits": self.fits, "mfu": self.mfu,
                "megatron_default": self.megatron_default, "flags": self.flags}
