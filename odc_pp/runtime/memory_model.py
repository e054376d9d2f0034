"""The size of every piece of state one training rank holds, as formulas (torch-free).

One owner for the memory of a rank: the dry run (:mod:`odc_pp.training.dry_run`) measures
what it can under FakeTensorMode and checks these formulas against the tracked tensors;
the docs table (docs/memory.md) is made from them. Notation, per rank: ``P_u`` trainable
elements of local unit (pipeline chunk) u on this tensor-parallel rank, ``P = sum P_u``,
``O_u = ceil(P_u / dp)`` owned elements, ``O = sum O_u``, ``e`` bytes of a compute-dtype
value (2 for bf16), ``M`` bytes of one pipeline message (``s/t_sp * b * h * e``).

Per parameter (``odc_pp.odc.engine`` / ``sharded_optimizer`` / ``post_validation``):

* parameters, sharded: ``e * O`` (symmetric shard, peers read it);
* parameters, gathered: ``e * P`` (the pipeline driver gathers a chunk at its first use in
  a minibatch and keeps it until the step); 0 at dp=1, where the shard is the whole unit;
  ``--odc-param-residency layer``: ``e * (P - P_layers)`` kept, and ``2 * e * P_layer``
  (a layer and its neighbour) inside the F and B transients (odc_pp.odc.residency);
* gradient accumulators: ``4 * O`` (fp32, peers add into them);
* weight gradients, local accumulation (the default at dp=1 and with deterministic data
  parallelism): ``g * P`` (each unit's ``main_grad``, ``g`` = 4 for fp32, 2 with
  ``--grad-reduce-in-bf16``; pushed once per minibatch and staged by reference), 0 at dp=1
  (it is the owner's fp32 accumulator); no compute-dtype copy;
* weight gradients in flight, per-microbatch pushes: ``2 * e * max_u P_u`` (a chunk's
  ``.grad`` after its W and the flattened copy pushed from it); a flattened gradient is
  dropped as soon as its push completed;
* optimizer state: ``(8 + 4 [fp32 master when e != 4]) * O`` (weight decay needs no
  mask: the fused AdamW kernel runs over decayed and exempt pieces apart) plus a 1-byte
  gradient-norm mask per owned element of each unit whose owned range holds a
  parameter kept out of the norm (tp rank > 0: replicated ones; the tied output layer);
* ODC staging (deterministic data parallelism with per-microbatch pushes): ``4 * P_u`` for each unit
  that pushed since the last sync (fp32, the unit's whole flat gradient: the summation
  order is fixed by adding whole staged sums in rank order at sync); freed at the sync.
  ``--nondeterministic-dp``, or local accumulation (staged by reference): 0;
* post-validation snapshot (``--enable-optimizer-post-validation``): ``16 * O`` (fp32
  master, both moments and the step's gradients: a rollback restores the first three, a
  clipped redo also needs the gradients), held from one step to its validation during the
  next minibatch.

Per microbatch (measured by the dry run per chunk, placed in time by the schedule):

* saved activations of (chunk, microbatch): from its F to its B (W-held part to its W);
  the received input activation (``M``) is kept with them;
* W-held tensors: the linear inputs and output gradients the deferred weight gradient
  needs, from B to W;
* in-flight sends: ``M`` per sent tensor still held; a send is dropped at the first comm
  group after it completed (NCCL: once the receiver took it), which the schedule's
  simulation gives;
* in-flight receives: ``M`` per receive posted and not yet consumed;
* offload buffers: the offloaded activations live in host memory (device: 0).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

__all__ = ["GB", "CATEGORIES", "UnitSizes", "state_bytes", "MemoryReport", "ChunkBytes",
           "schedule_peak", "count_sends"]

GB = 1e9

CATEGORIES = ("params_gathered", "params_sharded", "weight_grads", "grad_accumulators",
              "optimizer_state", "odc_staging", "post_validation_snapshot", "sends",
              "receives", "activations", "w_held", "offload_device", "transient")
"""Report categories, in table order."""


@dataclass(frozen=True, kw_only=True)
class UnitSizes:
    """What the per-parameter formulas need about one rank."""

    unit_params: tuple[int, ...]
    """Trainable elements of each local unit (chunk) on this tensor-parallel rank."""
    dp: int
    """Data-parallel size (ODC group)."""
    param_bytes: int
    """Bytes of a compute-dtype value (2: bf16)."""
    deterministic: bool
    """Deterministic data parallelism (staged accumulation)."""
    post_validation: bool
    """--enable-optimizer-post-validation."""
    local_grads: bool = False
    """Weight gradients summed into a ``main_grad`` of each unit
    (``odc_pp.odc.engine.accumulates_locally``) instead of pushed from ``.grad``."""
    gathered_params: tuple[int, ...] | None = None
    """Per unit: elements gathered from first use to the step (layer residency: the unit
    without its layers, which the F/B transients hold one or two at a time); None: all."""
    main_grad_bytes: int = 4
    """Bytes of a ``main_grad`` value at dp > 1: 4 (fp32), 2 (``--grad-reduce-in-bf16``)."""
    norm_mask: tuple[bool, ...] = ()
    """Per unit: some of its owned parameters are kept out of the gradient norm (tp rank
    > 0: the replicated ones; a model tied across stages: the output layer's copy) -- a
    1-byte mask per owned element; empty: no unit has one."""

    def owned(self, unit: int) -> int:
        return math.ceil(self.unit_params[unit] / self.dp)


def state_bytes(sizes: UnitSizes) -> dict[str, int]:
    """Per-parameter state of one rank, in bytes, per category (module docstring)."""
    e = sizes.param_bytes
    params = sum(sizes.unit_params)
    owned = sum(sizes.owned(u) for u in range(len(sizes.unit_params)))
    largest = max(sizes.unit_params)
    master = 4 if e != 4 else 0
    masks = sum(sizes.owned(u) for u, has in enumerate(sizes.norm_mask) if has)
    alone = sizes.dp == 1  # the gathered copy is the shard, the local gradient the owner's
    if sizes.local_grads:
        weight_grads, staging = (0 if alone else sizes.main_grad_bytes * params), 0
    else:
        weight_grads, staging = 2 * e * largest, 4 * params if sizes.deterministic else 0
    return {
        "params_gathered": 0 if alone else e * (params if sizes.gathered_params is None
                                                 else sum(sizes.gathered_params)),
        "params_sharded": e * owned,
        "weight_grads": weight_grads,
        "grad_accumulators": 4 * owned,
        "optimizer_state": (8 + master) * owned + masks,
        "odc_staging": staging,
        "post_validation_snapshot": 16 * owned if sizes.post_validation else 0,
    }


@dataclass
class MemoryReport:
    """Peak memory of one rank by category (bytes), and whether it fits."""

    rank: int
    """Global rank reported."""
    categories: dict[str, int]
    """Bytes per :data:`CATEGORIES` entry at this rank's peak."""
    memory_gb: float
    """The budget (--memory-gb)."""
    measured: dict[str, int] = field(default_factory=dict)
    """Values tracked under FakeTensorMode that the formulas were checked against."""
    advice: list[str] = field(default_factory=list)
    """Flags that would make the job fit (empty when it fits)."""
    advised: dict[str, int] = field(default_factory=dict)
    """:attr:`categories` with the exactly re-evaluated advice applied."""
    param_residency: str = "minibatch"
    """How long gathered parameters live (--odc-param-residency, auto resolved)."""

    @property
    def advised_total(self) -> int:
        return sum((self.advised or self.categories).values())

    @property
    def total(self) -> int:
        return sum(self.categories.values())

    @property
    def fits(self) -> bool:
        return self.total <= self.memory_gb * GB

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(total_gb=self.total / GB, fits=self.fits,
                   categories_gb={k: round(v / GB, 3) for k, v in self.categories.items()},
                   advised_total_gb=self.advised_total / GB,
                   advised_fits=self.advised_total <= self.memory_gb * GB)
        return out

    def format(self) -> str:
        """One table (this job's peak by category), then the advice and its effect."""
        lines = [f"rank {self.rank}: peak {self.total / GB:.2f} GB of {self.memory_gb:g} GB "
                 f"-> {_verdict(self.fits)} (ODC parameter residency: "
                 f"{self.param_residency})"]
        for name in CATEGORIES:
            lines.append(f"  {name:26s} {self.categories.get(name, 0) / GB:9.3f} GB")
        for line in self.advice:
            lines.append(f"  advice: {line}")
        if self.advice:
            fits = self.advised_total <= self.memory_gb * GB
            lines.append(f"  effect of the advice: {self.total / GB:.2f} GB -> "
                         f"{self.advised_total / GB:.2f} GB ({_verdict(fits)}; exact for "
                         f"the flags it re-evaluates, the rest needs another dry run)")
        return "\n".join(lines)


def _verdict(fits: bool) -> str:
    return "fits" if fits else "DOES NOT FIT"


@dataclass(frozen=True, kw_only=True)
class ChunkBytes:
    """Per-microbatch memory of one local chunk, measured by the dry run (bytes)."""

    saved: int
    """Held from its F to its B: saved activations, the received input, the output."""
    w_held: int
    """Held from its B to its W: the deferred weight gradient's inputs/output grads."""
    transient_f: int = 0
    """Peak above ``saved`` during the F (temporaries)."""
    transient_b: int = 0
    """Peak above the steady state during the B (gradients of activations)."""
    transient_w: int = 0
    """Peak above the steady state during the W (the weight gradients and their flat
    copy are counted in ``weight_grads``)."""


def schedule_peak(schedule, rank: int, chunks: list[ChunkBytes], *, message_bytes: int,
                  costs=None, receives_preposted: bool = False) -> dict[str, int]:
    """Walk ``rank``'s actions of the lowered ``schedule`` and return the per-microbatch
    categories (activations, w_held, sends, receives, offload_device, transient) at the
    moment their sum peaks. Sends are dropped as :meth:`PeerTransport.reap_sends` does:
    at the first comm group starting after the send completed in the schedule's
    simulation (``costs``: the cost model; default uniform).
    ``receives_preposted``: every receive buffer exists from the minibatch's start (gloo)."""
    from odc_pp.schedule.costs import CostModel
    from odc_pp.schedule.ir import COMM_KINDS, ActionKind as K
    from odc_pp.schedule.simulator import simulate

    sim = simulate(schedule, costs or CostModel())
    actions = schedule.ranks[rank]
    state = {"activations": 0, "w_held": 0, "sends": 0, "receives": 0, "offload_device": 0}
    live_sends: list[float] = []  # completion times of held sends
    if receives_preposted:
        state["receives"] = message_bytes * sum(
            a.kind in (K.RECV_F, K.RECV_B) for a in actions)
    peak, at_peak = -1, {}
    previous_comm = False
    for action in actions:
        kind, c = action.kind, action.chunk
        is_comm = kind in COMM_KINDS
        if is_comm and not previous_comm:
            now = sim.start[action]
            live_sends = [t for t in live_sends if t > now]
        previous_comm = is_comm
        state["sends"] = len(live_sends) * message_bytes
        transient = 0
        if kind is K.F:
            state["activations"] += chunks[c].saved
            transient = chunks[c].transient_f
        elif kind in (K.B, K.BW):
            transient = chunks[c].transient_b
        elif kind is K.W:
            transient = chunks[c].transient_w
        elif (kind is K.RECV_F or kind is K.RECV_B) and not receives_preposted:
            state["receives"] += message_bytes
        total = sum(state.values()) + transient
        if total > peak:
            peak, at_peak = total, dict(state, transient=transient)
        if kind in (K.B, K.BW):
            state["activations"] -= chunks[c].saved
            if kind is K.B:
                state["w_held"] += chunks[c].w_held
        elif kind is K.W:
            state["w_held"] -= chunks[c].w_held
        elif kind is K.OFFLOAD:
            state["activations"] -= chunks[c].saved
        elif kind is K.RELOAD:
            state["activations"] += chunks[c].saved
        elif kind in (K.SEND_F, K.SEND_B):
            live_sends.append(sim.end[action])
        if kind in (K.F, K.B, K.BW) and _consumes_message(schedule, rank, action):
            state["receives"] -= message_bytes
    return at_peak


def _consumes_message(schedule, rank: int, action) -> bool:
    """F of a stage > 0 / B of a non-last stage whose neighbour is on another rank."""
    from odc_pp.schedule.ir import ActionKind as K

    if action.kind is K.F:
        neighbour = schedule.prev_stage_rank(rank, action.chunk)
    else:
        neighbour = schedule.next_stage_rank(rank, action.chunk)
    return neighbour is not None and neighbour != rank


def count_sends(schedule, rank: int) -> int:
    """SEND actions of ``rank`` in one minibatch."""
    return sum(a.kind.value.startswith("SEND") for a in schedule.ranks[rank])
