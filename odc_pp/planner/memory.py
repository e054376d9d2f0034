"""The size of every piece of state one training rank holds, as formulas (torch-free).

One owner for the memory of a rank: the dry run (:mod:`odc_pp.training.dry_run`) measures
what it can under FakeTensorMode and checks these formulas against the tracked tensors;
the docs table (docs/memory.md) is made from them. Notation, per rank: ``P_u`` trainable
elements of local unit (pipeline chunk) u on this tensor-parallel rank, ``P = sum P_u``,
``O_u = ceil(P_u / dp)`` owned elements, ``O = sum O_u``, ``e`` bytes of a compute-dtype
value (2 for bf16), ``M`` bytes of one pipeline message (``s/t_sp * b * h * e``).

Per parameter (``odc_pp.odc.engine`` / ``sharded_optimizer`` / ``post_validation``):

* parameters, sharded: ``e * O`` (symmetric shard, peers read it); ``--dp-mode ddp``: 0,
  and the gathered parameters are ``e * dp * O`` (replicated, padded to whole shards, each
  rank's shard a slice of them);
* parameters, gathered: ``e * P`` (the pipeline driver gathers a chunk at its first use in
  a minibatch and keeps it until the step); 0 at dp=1, where the shard is the whole unit;
  ``--odc-param-residency layer``: ``e * (P - P_layers)`` kept, and ``2 * e * P_layer``
  (a layer and the one gathered ahead: the next in F, the previous in B; an embedding
  gathered per use with layer 0: ``e * (P_embedding + P_layer)``) inside the F and B
  transients (odc_pp.odc.residency);
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

Activations (one model: :func:`saved_bytes_per_token`, per layer and token): the bytes
the FakeTensor dry run measured for the layer's kind (:mod:`.layer_kinds`, the table
``layer_activations.json``; the dry run's memory model ``odc_pp.training.plan_memory``,
the planner's :func:`layer_activation_bytes` and ``odc-pp tune-offload`` all read it).
What ``recompute_lgd`` removes, by the formula (torch-free; the table measures it):

Per transformer layer and microbatch, with ``tokens = s * b``, hidden size h, MLP width f,
``e`` bytes per activation value and ``m`` bytes per dropout-mask element, the layer
stops saving (see :mod:`odc_pp.megatron.recompute`):

* the two layernorm outputs (inputs of ``linear_qkv`` and ``linear_fc1``):
  ``2 * tokens * h * e``, plus the two per-token statistics (mean, rstd) of each
  layernorm, ``2 * 2 * tokens * stat_bytes`` (fp32 statistics: ``stat_bytes = 4``);
* the GeLU output (input of ``linear_fc2``): ``tokens * f * e``;
* with hidden dropout > 0, the two hidden-dropout masks ``2 * tokens * h * m``, replaced by
  the two ``[s, b, 1]`` int64 token keys they are recomputed from
  (``2 * tokens * key_bytes``, ``key_bytes = 8``; :mod:`odc_pp.megatron.dropout`).

With f = 4h, e = 2 (bf16), m = 1 (the keyed dropout's bool mask) and the O(tokens) terms
dropped, this is 14 * s * b * h (:func:`lgd_saving_per_token_hidden`; Korthikanti et al.,
"Reducing Activation Recomputation in Large Transformer Models"). The measured GPT layer
(GeLU, LayerNorm, hidden dropout, flash attention, f = 4h) keeps 34 h + 4 a + 8 bytes per
token without and 20 h + 4 a + 16 with it -- Korthikanti's 34 and PipeOffload's 20
(App. C).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

from .hardware import GB
from .layer_kinds import kind_bytes, layer_kind
from .model import ModelShape

__all__ = ["GB", "CATEGORIES", "UnitSizes", "state_bytes", "planned_state_bytes",
           "MemoryReport", "ChunkBytes", "schedule_peak", "count_sends", "Workload",
           "layer_activation_bytes", "saved_bytes_per_token", "lgd_saving_per_token_hidden",
           "lgd_saved_bytes_per_layer",
           "dropout_mask_bytes", "DROPOUT_KEY_BYTES"]


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
    replicated: bool = False
    """``--dp-mode ddp``: every unit's parameters are resident, padded to ``dp`` whole
    shards, and each rank's parameter shard is a slice of them (odc_pp.odc.ddp)."""
    norm_mask: tuple[bool, ...] = ()
    """Per unit: some of its owned parameters are kept out of the gradient norm (tp rank
    > 0: the replicated ones; a model tied across stages: the output layer's copy) -- a
    1-byte mask per owned element; empty: no unit has one."""

    shard_params: tuple[int, ...] | None = None
    """Per unit: elements of each rank's shard, padding included (layer residency shards
    every layer on its own, ``odc_pp.odc.shard_map``: up to one element more per layer);
    None: ``ceil(unit_params / dp)``."""

    def owned(self, unit: int) -> int:
        if self.shard_params is not None:
            return self.shard_params[unit]
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
    if sizes.replicated and not alone:
        gathered, sharded = e * sizes.dp * owned, 0
    else:
        gathered = 0 if alone else e * (params if sizes.gathered_params is None
                                        else sum(sizes.gathered_params))
        sharded = e * owned
    return {
        "params_gathered": gathered,
        "params_sharded": sharded,
        "weight_grads": weight_grads,
        "grad_accumulators": 4 * owned,
        "optimizer_state": (8 + master) * owned + masks,
        "odc_staging": staging,
        "post_validation_snapshot": 16 * owned if sizes.post_validation else 0,
    }


def planned_state_bytes(unit_params: Sequence[float], *, dp: int, param_bytes: int = 2,
                        one_sided: bool = True, post_validation: bool = False,
                        replicated: bool = False) -> int:
    """:func:`state_bytes` of one rank as the planner and the tuner assume the job runs:
    ODC's pipeline driver with deterministic data parallelism (weight gradients summed in
    each unit's fp32 ``main_grad``), or ``one_sided=False`` the collective mode (pushed
    per microbatch), or ``replicated`` ``--dp-mode ddp`` (replicated parameters, local
    ``main_grad``); ``unit_params``: trainable elements of each local chunk on this
    tensor-parallel rank; ``dp``: the group the state is sharded over (dp x cp)."""
    sizes = UnitSizes(unit_params=tuple(int(round(p)) for p in unit_params), dp=dp,
                      param_bytes=param_bytes, deterministic=one_sided,
                      post_validation=post_validation, local_grads=one_sided or replicated,
                      replicated=replicated)
    return sum(state_bytes(sizes).values())


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
    simulation (``costs``: the cost model; default uniform). An OFFLOAD's activations stay
    on the device (``offload_device``) until its copy completes in the simulation (the
    host link of ``costs``; without one, one forward's time per chunk).
    ``receives_preposted``: every receive buffer exists from the minibatch's start (gloo)."""
    from odc_pp.schedule.ir import COMM_KINDS, ActionKind as K
    from odc_pp.schedule.simulator import simulate

    sim = simulate(schedule, _walk_costs(schedule, costs))
    actions = schedule.ranks[rank]
    state = {"activations": 0, "w_held": 0, "sends": 0, "receives": 0, "offload_device": 0}
    live_sends: list[float] = []  # completion times of held sends
    live_offloads: list[tuple[float, int]] = []  # (completion, bytes) of copies to host
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
        # an offloaded chunk's activations leave the device when its copy completes
        live_offloads = [(t, b) for t, b in live_offloads if t > sim.start[action]]
        state["offload_device"] = sum(b for _, b in live_offloads)
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
        _after(action, chunks[c], state, end=sim.end[action], live_sends=live_sends,
               live_offloads=live_offloads)
        if kind in (K.F, K.B, K.BW) and _consumes_message(schedule, rank, action):
            state["receives"] -= message_bytes
    return at_peak


def _walk_costs(schedule, costs):
    """The cost model :func:`schedule_peak` simulates (default uniform). The walk needs
    only the order of completions, so without a host-link figure (a job without
    --cost-model) an OFFLOAD is timed at F's pace, as the uniform default times compute."""
    from odc_pp.schedule.costs import CostModel
    from odc_pp.schedule.ir import ActionKind as K

    costs = costs or CostModel()
    if costs.offload_bandwidth is None and any(
            a.kind is K.OFFLOAD for actions in schedule.ranks for a in actions):
        costs = replace(costs, offload_bandwidth=1.0)
    return costs


def _after(action, chunk: ChunkBytes, state: dict[str, int], *, end: float,
           live_sends: list[float], live_offloads: list[tuple[float, int]]) -> None:
    """What ``action`` (ending at ``end`` in the simulation) frees or keeps once it ran."""
    from odc_pp.schedule.ir import ActionKind as K

    kind = action.kind
    if kind in (K.B, K.BW):
        state["activations"] -= chunk.saved
        if kind is K.B:
            state["w_held"] += chunk.w_held
    elif kind is K.W:
        state["w_held"] -= chunk.w_held
    elif kind is K.OFFLOAD:
        state["activations"] -= chunk.saved
        live_offloads.append((end, chunk.saved))
        state["offload_device"] += chunk.saved
    elif kind is K.RELOAD:
        state["activations"] += chunk.saved
    elif kind in (K.SEND_F, K.SEND_B):
        live_sends.append(end)


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


DROPOUT_KEY_BYTES = 8
"""Bytes per token of the int64 key a recomputed (``recompute_lgd``) dropout keeps."""


def dropout_mask_bytes(device_type: str, bytes_per_value: int) -> int:
    """Bytes per element that a *stored* dropout keeps for backward: the keyed dropout
    (:mod:`odc_pp.megatron.dropout`) saves a bool mask on every device and dtype."""
    del device_type, bytes_per_value
    return 1


def lgd_saving_per_token_hidden(*, ffn_ratio: float = 4.0, bytes_per_value: int = 2,
                                mask_bytes: int = 1, dropout: bool = True) -> float:
    """Bytes per (token x hidden unit) that recomputing layernorm, GeLU and dropout removes
    from one layer, ignoring the O(tokens) terms: ``(2 + ffn_ratio) * e + 2 * m``."""
    return (2 + ffn_ratio) * bytes_per_value + (2 * mask_bytes if dropout else 0)


def lgd_saved_bytes_per_layer(*, tokens: int, hidden_size: int, ffn_hidden_size: int,
                              bytes_per_value: int, dropout: bool, mask_bytes: int,
                              stat_bytes: int = 4, key_bytes: int = DROPOUT_KEY_BYTES) -> int:
    """Exact bytes one layer stops holding per microbatch (module docstring)."""
    norms = 2 * tokens * (hidden_size * bytes_per_value + 2 * stat_bytes)
    gelu = tokens * ffn_hidden_size * bytes_per_value
    masks = 2 * tokens * (hidden_size * mask_bytes - key_bytes) if dropout else 0
    return norms + gelu + masks


@dataclass(frozen=True, kw_only=True)
class Workload:
    """The model being trained and the microbatches it is trained on."""

    model: ModelShape
    """The transformer's shape."""
    seq_length: int
    """Sequence length s."""
    micro_batch_size: int = 1
    """Samples per microbatch b."""
    flash_attention: bool = True
    """No s^2 attention-matrix activations (flash attention)."""
    bytes_per_value: int = 2
    """Bytes of one activation value (2: bf16/fp16)."""

    def __post_init__(self) -> None:
        for name in ("seq_length", "micro_batch_size", "bytes_per_value"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1")


def saved_bytes_per_token(model: ModelShape, *, seq_length: int, flash: bool = True,
                          recompute: bool | str = False, tp: int = 1,
                          sequence_parallel: bool = True, quantity: str = "saved") -> float:
    """Bytes one transformer layer of ``model`` holds per token on one tensor-parallel
    rank (bf16): ``quantity`` saved (from its F to its B) or w_held (from its B to its
    W), as the FakeTensor dry run measured its kind
    (:mod:`odc_pp.planner.layer_kinds`: the one activation model, which the dry run's
    memory model ``odc_pp.training.plan_memory``, the planner's
    :func:`layer_activation_bytes` and ``odc-pp tune-offload`` read). ``recompute``:
    True/False for --recompute-lgd, or none/lgd/full; ``seq_length``: the attention's
    span (the unfused attention keeps ``s x s`` scores)."""
    kind = layer_kind(model, flash=flash, recompute=recompute)
    per_token = kind_bytes(kind, quantity).per_token(
        h=model.hidden_size, ffn=model.ffn, kv=model.kv_width,
        heads=model.num_attention_heads, seq=seq_length, tp=tp,
        sequence_parallel=sequence_parallel or tp == 1)
    if kind.attention == "gqa" and kind.position != "rope" and kind.recompute != "full" \
            and quantity == "saved" and model.query_groups <= tp:
        per_token -= 2 * model.query_width / tp  # one group per rank: no query copy
    return per_token


def layer_activation_bytes(shape: Workload, *, recompute: bool | str, tp: int = 1,
                           sequence_parallel: bool = False) -> float:
    """Saved activation bytes of one layer and microbatch on one tensor-parallel rank:
    :func:`saved_bytes_per_token` of its tokens (the measured table, the unfused
    attention's scores included), scaled to ``shape.bytes_per_value``."""
    per_token = saved_bytes_per_token(shape.model, seq_length=shape.seq_length,
                                      flash=shape.flash_attention, recompute=recompute,
                                      tp=tp, sequence_parallel=sequence_parallel or tp == 1)
    return shape.seq_length * shape.micro_batch_size * per_token * shape.bytes_per_value / 2
