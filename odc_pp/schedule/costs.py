"""Cost model: per-stage compute times, communication, offload bandwidth, memory deltas."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

from .ir import ActionKind

__all__ = ["transformer_layer_flops", "CostModel", "tensor_parallel_comm_seconds",
           "ring_collective_seconds",
           "tensor_parallel_activation_factor", "with_full_recompute",
           "with_stage_sizes"]

Number = float | int


def _per_stage(value: Number | Sequence[Number], stage: int, rank: int, pp: int,
               num_stages: int, what: str) -> float:
    if isinstance(value, (int, float)):
        return float(value)
    values = list(value)
    if len(values) == num_stages:
        return float(values[stage])
    if len(values) == pp:
        return float(values[rank])
    raise ValueError(f"{what} has {len(values)} entries; give one number, one per rank "
                     f"({pp}) or one per virtual stage ({num_stages})")


@dataclass(kw_only=True)
class CostModel:
    """Times are in arbitrary but consistent units (the simulator reports in the same unit).

    Compute times are per microbatch and per *virtual stage* (model chunk): a scalar
    applies to every stage, a list of ``pp`` entries gives one value per rank (all its
    chunks), a list of ``pp * num_chunks`` entries gives one value per virtual stage.
    """

    t_f: Number | Sequence[Number] = 1.0
    """Forward time of one microbatch on one virtual stage."""
    t_b: Number | Sequence[Number] = 1.0
    """Input-gradient (B) time of one microbatch on one virtual stage."""
    t_w: Number | Sequence[Number] = 1.0
    """Weight-gradient (W) time of one microbatch on one virtual stage."""
    t_comm: float = 0.0
    """Latency of one activation or gradient transfer between two ranks."""
    t_send_cpu: float = 0.0
    """Time a rank is blocked issuing one explicit SEND (e.g. gloo copies the payload into
    the socket on the caller's thread); 0: sends are free for the sender. Part of the
    transfer's ``t_comm``, not added to it."""
    t_recv_cpu: float = 0.0
    """Time a rank is blocked posting one explicit RECV; 0: free."""
    offload_bandwidth: float | None = None
    """Host-link bandwidth in microbatch-chunk activations per time unit (moving one
    microbatch-chunk's activations takes ``1 / offload_bandwidth``); None: no offload."""
    mem_f: float = 1.0
    """Activation memory change of F, in microbatch-chunk units."""
    mem_b: float = 0.0
    """Activation memory change of B."""
    mem_w: float = -1.0
    """Activation memory change of W."""
    microbatch_scale: Sequence[float] | None = None
    """Relative compute cost of each microbatch (index: microbatch id; every F, B and W
    of microbatch i takes ``scale[i]`` times its stage's time): variable-length data gives
    microbatches of different cost, and their spread adds bubbles a mean cost hides. None:
    every microbatch costs the same."""

    def __post_init__(self) -> None:
        for name in ("t_f", "t_b", "t_w"):
            value = getattr(self, name)
            values = [value] if isinstance(value, (int, float)) else list(value)
            if not values or any(not math.isfinite(v) or v < 0 for v in values):
                raise ValueError(f"{name} must be finite non-negative numbers, got {value!r}")
        for name in ("t_comm", "t_send_cpu", "t_recv_cpu"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        if self.offload_bandwidth is not None and not (
                math.isfinite(self.offload_bandwidth) and self.offload_bandwidth > 0):
            raise ValueError(f"offload_bandwidth must be a finite number > 0, got "
                             f"{self.offload_bandwidth}")
        if not all(math.isfinite(getattr(self, n)) for n in ("mem_f", "mem_b", "mem_w")):
            raise ValueError(f"mem_f, mem_b and mem_w must be finite, got {self.mem_f}, "
                             f"{self.mem_b} and {self.mem_w}")
        if self.microbatch_scale is not None:
            scale = list(self.microbatch_scale)
            if any(not math.isfinite(v) or v < 0 for v in scale):
                raise ValueError(f"microbatch_scale must be finite non-negative numbers, got "
                                 f"{self.microbatch_scale!r}")
            self.microbatch_scale = tuple(float(v) for v in scale)
        if abs(self.mem_f + self.mem_b + self.mem_w) > 1e-9:
            raise ValueError("memory deltas must sum to zero (mem_f + mem_b + mem_w == 0): "
                             "a microbatch's activations must be freed by its backward")

    def compute_time(self, kind: ActionKind, *, stage: int, rank: int, pp: int,
                     num_stages: int) -> float:
        """Duration of a compute action (BW = B + W)."""
        args = dict(stage=stage, rank=rank, pp=pp, num_stages=num_stages)
        if kind is ActionKind.F:
            return _per_stage(self.t_f, what="t_f", **args)
        if kind is ActionKind.B:
            return _per_stage(self.t_b, what="t_b", **args)
        if kind is ActionKind.W:
            return _per_stage(self.t_w, what="t_w", **args)
        if kind is ActionKind.BW:
            return _per_stage(self.t_b, what="t_b", **args) + _per_stage(
                self.t_w, what="t_w", **args)
        raise ValueError(f"{kind} is not a compute action")

    def memory_delta(self, kind: ActionKind) -> float:
        return {ActionKind.F: self.mem_f, ActionKind.B: self.mem_b, ActionKind.W: self.mem_w,
                ActionKind.BW: self.mem_b + self.mem_w}.get(kind, 0.0)

    @property
    def offload_time(self) -> float:
        """Time to move one microbatch-chunk's activations across the host link."""
        if self.offload_bandwidth is None:
            raise ValueError("offload needs the host-link bandwidth: give --offload-bandwidth "
                             "(\"offload_bandwidth\" in a --cost-model file)")
        return 1.0 / self.offload_bandwidth

    def scale_of(self, microbatch: int) -> float:
        """The relative cost of ``microbatch`` (1 without ``microbatch_scale``)."""
        if self.microbatch_scale is None:
            return 1.0
        if not 0 <= microbatch < len(self.microbatch_scale):
            raise ValueError(f"microbatch_scale has {len(self.microbatch_scale)} entries; "
                             f"microbatch {microbatch} has none")
        return self.microbatch_scale[microbatch]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "CostModel":
        return cls(**data)


def with_stage_sizes(costs: CostModel, sizes: Sequence[float],
                     stage_ranks: Sequence[int]) -> CostModel:
    """``costs`` for stages of different sizes: each virtual stage's T_F, T_B and T_W
    scaled by ``sizes[stage]`` (its layers over the mean,
    :meth:`~odc_pp.schedule.stage_layout.StageLayout.relative_sizes`; ``stage_ranks``: the
    rank of each virtual stage, for per-rank cost lists). A time given per virtual stage
    already is each stage's own (measured) and stays as it is; a scalar or per-rank time
    becomes a per-stage list. All-ones sizes return ``costs`` unchanged."""
    from dataclasses import replace

    if all(size == 1.0 for size in sizes):
        return costs
    num_stages, pp = len(sizes), max(stage_ranks) + 1
    if len(stage_ranks) != num_stages:
        raise ValueError("give one rank per virtual stage")
    scaled = {name: [size * _per_stage(getattr(costs, name), stage, rank, pp, num_stages, name)
                     for stage, (size, rank) in enumerate(zip(sizes, stage_ranks))]
              for name in ("t_f", "t_b", "t_w")
              if isinstance(getattr(costs, name), (int, float))
              or len(getattr(costs, name)) != num_stages}
    return replace(costs, **scaled)


def with_full_recompute(costs: CostModel, fractions: Sequence[float],
                        stage_ranks: Sequence[int]) -> CostModel:
    """``costs`` with full activation recompute: B re-runs the forward of the recomputed
    layers first, so each virtual stage's T_B grows by ``fraction * T_F`` (``fractions``:
    per virtual stage, recomputed layers / layers of the stage; ``stage_ranks``: the rank
    of each virtual stage, for per-rank cost lists). T_W is unchanged (W uses what B
    recomputed). The result gives T_B per virtual stage."""
    from dataclasses import replace

    num_stages, pp = len(fractions), max(stage_ranks) + 1
    if len(stage_ranks) != num_stages:
        raise ValueError("give one rank per virtual stage")
    if any(not 0.0 <= f <= 1.0 for f in fractions):
        raise ValueError(f"recompute fractions must lie in [0, 1], got {list(fractions)}")
    t_b = [_per_stage(costs.t_b, stage, rank, pp, num_stages, "t_b")
           + fraction * _per_stage(costs.t_f, stage, rank, pp, num_stages, "t_f")
           for stage, (fraction, rank) in enumerate(zip(fractions, stage_ranks))]
    return replace(costs, t_b=t_b)


def transformer_layer_flops(batch: int, seq: int, hidden: int, ffn_hidden: int, *,
                            query_width: int | None = None, kv_width: int | None = None,
                            gated_mlp: bool = False,
                            causal: bool = False) -> tuple[float, float, float]:
    """Forward, input-gradient (B) and weight-gradient (W) FLOPs of one transformer layer
    on one ``[batch, seq]`` microbatch (multiply-add = 2 FLOPs), Megatron-LM's formula
    (``num_floating_point_operations``): per token the query and output projections
    ``2 h q`` (``q`` = heads x kv_channels, ``h`` by default), the key and value
    projections ``2 h k`` (``k`` = query groups x kv_channels: GQA makes them smaller),
    the MLP ``2 h f``, or ``3 h f`` with a gated MLP (SwiGLU's fc1 has ``2 f`` outputs);
    each costs ``2 b s x`` in F, again in B and in W. Attention scores and values cost
    ``4 b s^2 q`` in F and twice that in B (no causal halving, as in Megatron-LM and
    torchtitan). The one FLOPs formula of the project: the offload tuner's cost
    estimate, the planner and the training log's TFLOP/s and MFU use it.

    ``causal=True`` gives the FLOPs a causal flash-attention kernel executes instead: it
    skips the masked blocks, so attention costs half of the formula's (``2 b s^2 q`` in
    F, ``4 b s^2 q`` in B). The planner times passes with these and reports MFU with the
    formula's (Megatron-LM's meaning of MFU)."""
    query = hidden if query_width is None else query_width
    kv = query if kv_width is None else kv_width
    weights = 2 * hidden * query + 2 * hidden * kv + (3 if gated_mlp else 2) * hidden * ffn_hidden
    dense = 2 * batch * seq * weights
    attention = (2 if causal else 4) * batch * seq * seq * query
    return float(dense + attention), float(dense + 2 * attention), float(dense)



def ring_collective_seconds(message_bytes: float, ranks: int, *, link_bytes_per_s: float,
                            latency_s: float = 0.0) -> float:
    """One ring all-gather or reduce-scatter of a ``message_bytes`` tensor (the gathered,
    whole one) over ``ranks`` ranks: ``ranks - 1`` steps, each paying the link latency
    ``latency_s`` and moving ``1/ranks`` of the tensor at ``link_bytes_per_s`` (the
    collective's bus bandwidth, nccl-tests' busbw): ``(n-1) alpha + (n-1)/n bytes / bw``.
    An all-reduce is twice this. Zero on one rank."""
    if ranks == 1:
        return 0.0
    if not (math.isfinite(link_bytes_per_s) and link_bytes_per_s > 0) or latency_s < 0:
        raise ValueError("a collective needs the link bandwidth (> 0 bytes/s) and a latency "
                         ">= 0")
    return (ranks - 1) * latency_s + (ranks - 1) / ranks * message_bytes / link_bytes_per_s


def tensor_parallel_comm_seconds(*, tokens: int, hidden: int, bytes_per_value: int, tp: int,
                                 link_bytes_per_s: float, sequence_parallel: bool,
                                 keep_sp_input_for_w: bool,
                                 latency_s: float = 0.0) -> tuple[float, float, float]:
    """Communication time of one transformer layer's F, B and W under Megatron tensor
    parallelism, on a ring of ``tp`` ranks over a link of ``link_bytes_per_s`` bus
    bandwidth and ``latency_s`` per ring step (``tokens`` = s x b of one microbatch). An
    all-gather or reduce-scatter of the ``[s, b, h]`` activation (v bytes) takes
    :func:`ring_collective_seconds` (``(tp-1) alpha + (tp-1)/tp v / bw``), an all-reduce
    twice that.

    * F: two all-reduces (attention and MLP outputs); with sequence parallelism two
      all-gathers + two reduce-scatters, the same time.
    * B: the same again (input gradients of the column-parallel linears; with SP their
      reduce-scatters and the all-gathers of the row-parallel outputs' gradients).
    * W: with SP and without ``keep_sp_input_for_w`` the two column-parallel linears
      gather their input again (two all-gathers); otherwise nothing.

    Zero at tp = 1. This is the estimate the tuner folds into t_f / t_b / t_w; training
    measures the same communication inside each action's time (the profiler)."""
    if tp == 1:
        return 0.0, 0.0, 0.0
    if not (math.isfinite(link_bytes_per_s) and link_bytes_per_s > 0):
        raise ValueError("tensor parallelism needs the tensor-parallel link bandwidth "
                         "(> 0 bytes/s)")
    one = ring_collective_seconds(tokens * hidden * bytes_per_value, tp,
                                  link_bytes_per_s=link_bytes_per_s, latency_s=latency_s)
    w = 2 * one if sequence_parallel and not keep_sp_input_for_w else 0.0
    return 4 * one, 4 * one, w


def tensor_parallel_activation_factor(*, tp: int, sequence_parallel: bool,
                                      replicated_share: float) -> float:
    """Per-rank share of a layer's saved activations under tensor parallelism: all of it
    splits over tp with sequence parallelism; without, the ``replicated_share`` saved
    outside the tensor-parallel regions (layernorm inputs, dropout masks: 10 of
    Korthikanti et al.'s 34 sbh) stays whole on every rank."""
    if tp == 1:
        return 1.0
    if sequence_parallel:
        return 1.0 / tp
    return replicated_share + (1.0 - replicated_share) / tp
