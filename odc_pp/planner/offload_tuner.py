"""``odc-pp tune-offload``: pick the pipeline schedule, activation-offload ratio and
recompute option with the best predicted step time that fits a device memory budget.

Estimates (per transformer layer, micro-batch size b, sequence s, hidden h, heads a, MLP
width f (``--ffn-hidden-size``, 4h by default), query width q = a x kv_channels, key/value
width k = query groups x kv_channels, vocabulary V, ``bytes_per_value`` = 2 for 16-bit
training; the shape is :class:`odc_pp.planner.model.ModelShape`):

* FLOPs: :meth:`ModelShape.layer_flops` (Megatron-LM's formula: ``2 b s (2 h q + 2 h k +
  2 h f)`` in each of F, B and W, ``3 h f`` with SwiGLU, plus attention ``4 b s^2 q`` in F
  and twice that in B); times = FLOPs / (peak x MFU). Recomputing layernorm/GeLU/dropout
  adds 5 % of the forward time to B.
* activations (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
  Transformer Models", 16-bit, no tensor parallelism): ``s b h (34 + 5 a s / h)`` bytes
  for a GPT (f = 4h, q = k = h); in general ``s b h (10 + 4 q/h + 4 k/h + 2 (f/h) (g + 1))``
  with g = 2 fc1 outputs per MLP unit under SwiGLU (1 without): the layernorm inputs and
  dropout masks (10), Q, K, V and the projection input (4 q/h + 4 k/h), fc1's output and
  the activation's output (2 (f/h) (g + 1)). The ``5 a s / h`` attention-matrix term is
  dropped with flash attention (default); recomputing layernorm, GeLU and dropout drops
  the two layernorm inputs (4 sbh), the activation's output (2 f/h sbh) and the dropout
  masks (2 sbh): 34 -> 20 for a GPT.
* model state: :meth:`ModelShape.layer_params` per layer plus ``V h`` for the embedding
  (first stage) and output layer (last stage); 2 bytes of 16-bit parameters, 4 of fp32
  gradients and 12 of fp32 master weights + Adam moments, the latter 12 sharded over the
  data-parallel ranks (ODC shards parameters/optimizer state).

Hardware: a preset of :mod:`odc_pp.planner.hardware` (``--preset``), or ``--measure`` instead times a matmul and a host-memory copy on this machine.

Tensor parallelism (``--devices N --tp-sizes 1,2,4,8``): at equal device count each tp
size gets ``pp = N / tp`` and every candidate below; for tp > 1 with
``--sequence-parallel``, re-gathering W's inputs and keeping them
(``--keep-sp-input-for-w``). Per rank the layer FLOPs and parameters divide by tp, the
activations by tp under SP (without SP the 10 sbh outside the tensor-parallel regions
stay whole: sbh (10 + 24/t), Korthikanti et al.), and F/B/W gain the ring collectives of
:func:`odc_pp.schedule.costs.tensor_parallel_comm_seconds` over the NVLink bandwidth
(presets: A100 NVLink3 240 GB/s, H100/H200 NVLink4 360 GB/s effective per direction);
keeping W's inputs holds ``2 (1 - 1/t) sbh`` bytes per layer from B to W.

Candidates are exactly what ``pretrain_gpt.py`` can run: every deterministic schedule
family of the registry (``odc_pp.schedule.generators.families``; zb-auto is left out:
training re-plans it from measured costs, so the simulated order is not what runs), with and without
``--recompute-lgd``, and for a family that offloads every non-empty set of
``--offload-chunks``. Each candidate's schedule is built by
``odc_pp.schedule.build.build`` -- the builder the training frontend
calls -- from the cost model the frontend will plan with (its ``--cost-model`` file,
passed here as ``--cost-model``; default: the frontend's default cost model), and timed
by the simulator under the estimated costs above. The printed flags therefore select
the very schedule whose step time is reported.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from dataclasses import dataclass, field

from odc_pp.schedule.cli_bounds import (MAX_MICROBATCHES, MAX_PP, bounded_float, bounded_int,
                                        check_work)
from odc_pp.schedule.costs import CostModel, tensor_parallel_comm_seconds
from odc_pp.schedule.build import ScheduleRequest, build
from odc_pp.schedule.generators import FAMILIES, family
from odc_pp.schedule.placement import rank_stages
from odc_pp.schedule.simulator import simulate

from .hardware import PRESETS, Hardware
from .memory import Workload, layer_activation_bytes, planned_state_bytes
from .model import ModelShape

__all__ = ["OffloadChoice", "TunerConfig", "tune", "tune_devices",
           "estimate_costs", "candidate_request", "format_ranking", "measure_hardware",
           "main"]

GB = 1e9


@dataclass(kw_only=True)
class TunerConfig:
    """What to tune for."""

    shape: Workload
    """Model shape and microbatch size."""
    hardware: Hardware
    """Compute speed and host link."""
    pp: int
    """Pipeline ranks."""
    num_microbatches: int
    """Microbatches per iteration (per data-parallel rank)."""
    dp: int = 1
    """Data-parallel ranks sharing the optimizer state."""
    memory_budget_gb: float | None = None
    """Usable device memory per rank (default: the hardware's memory)."""
    schedules: tuple[str, ...] = tuple(f.name for f in FAMILIES if not f.searched)
    """Schedule families tried (registry names; an offloading family is tried with every
    non-empty set of offload chunks)."""
    plan_costs: CostModel = field(default_factory=CostModel)
    """Cost model the training frontend builds schedules with: its ``--cost-model`` file
    (default: the frontend's default, ``CostModel()``)."""
    plan_costs_path: str | None = None
    """Path of that ``--cost-model`` file, repeated in the printed flags (None: no file)."""
    tp: int = 1
    """Tensor-parallel ranks per stage."""
    sequence_parallel: bool = False
    """``--sequence-parallel`` (needs tp > 1)."""
    keep_sp_input_for_w: bool = False
    """``--keep-sp-input-for-w`` (needs sequence_parallel)."""

    def __post_init__(self) -> None:
        heads = self.shape.model.num_attention_heads
        if self.tp < 1 or heads % self.tp or self.shape.model.query_groups % self.tp:
            raise ValueError(f"tensor-parallel size {self.tp} must be >= 1 and divide "
                             f"--num-attention-heads {heads} and the query groups")
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("sequence parallelism needs a tensor-parallel size > 1")
        if self.keep_sp_input_for_w and not self.sequence_parallel:
            raise ValueError("keeping W's inputs needs sequence parallelism")
        if self.tp > 1 and self.hardware.tp_link_gbps is None:
            raise ValueError("tensor parallelism needs the NVLink bandwidth: use a --preset "
                             "or give --tp-link-gbps")
        if self.pp < 1 or self.num_microbatches < 1 or self.dp < 1:
            raise ValueError("--pp, --num-microbatches and --dp must be >= 1")
        if self.num_microbatches < self.pp:
            raise ValueError(f"--num-microbatches {self.num_microbatches} must be >= --pp "
                             f"{self.pp}")
        if self.memory_budget_gb is not None and not (
                math.isfinite(self.memory_budget_gb) and self.memory_budget_gb > 0):
            raise ValueError(f"--memory-budget-gb must be a finite number > 0, got "
                             f"{self.memory_budget_gb}")
        for name in self.schedules:
            if family(name).searched:
                raise ValueError(f"schedule {name} is re-planned from measured costs during "
                                 f"training, so the simulated order is not what runs; it "
                                 f"cannot be tuned")

    @property
    def budget_bytes(self) -> float:
        return (self.memory_budget_gb or self.hardware.memory_gb) * GB


@dataclass
class OffloadChoice:
    """One ranked setting of the tuner: schedule, offload, recompute, and its estimate."""

    schedule: str
    """Registry family."""
    num_chunks: int
    """Model chunks per rank."""
    offload_chunks: tuple[int, ...]
    """Local chunks whose activations go to host memory (empty: none)."""
    recompute: bool
    """``--recompute-lgd``."""
    step_s: float
    """Simulated step time under the estimated costs."""
    peak_memory_gb: float
    """Largest per-rank peak (model state + activations)."""
    fits: bool
    """The peak fits the memory budget."""
    bubble_rate: float
    """Simulated bubble rate."""
    flags: list[str] = field(default_factory=list)
    """``pretrain_gpt.py`` flags that build exactly this candidate's schedule (add the
    data flags and run on pp x dp ranks)."""
    per_rank_peak_gb: list[float] = field(default_factory=list)
    """Per-rank peaks."""
    tp: int = 1
    """Tensor-parallel size (with pp, the devices of one replica: tp x pp)."""
    pp: int = 1
    """Pipeline size."""
    sequence_parallel: bool = False
    keep_sp_input_for_w: bool = False


def training_flags(config: TunerConfig, name: str, *, offload_chunks: tuple[int, ...],
                   recompute: bool) -> list[str]:
    """The ``pretrain_gpt.py`` flags of one candidate: schedule, pipeline, model shape and
    batch (``--global-batch-size`` = micro batch x microbatches x dp)."""
    shape, model = config.shape, config.shape.model
    global_batch = shape.micro_batch_size * config.num_microbatches * config.dp
    out = ["--pipeline-schedule", name,
           "--num-model-chunks", str(family(name).default_chunks),
           "--pipeline-model-parallel-size", str(config.pp),
           *model.megatron_flags(),
           "--seq-length", str(shape.seq_length),
           "--micro-batch-size", str(shape.micro_batch_size),
           "--global-batch-size", str(global_batch)]
    if offload_chunks:
        out += ["--cpu-offload", "--offload-chunks", *map(str, offload_chunks)]
    if recompute:
        out.append("--recompute-lgd")
    if config.tp > 1:
        out += ["--tensor-model-parallel-size", str(config.tp)]
    if config.sequence_parallel:
        out.append("--sequence-parallel")
    if config.keep_sp_input_for_w:
        out.append("--keep-sp-input-for-w")
    if config.plan_costs_path is not None:
        out += ["--cost-model", config.plan_costs_path]
    return out


def estimate_costs(config: TunerConfig, schedule: str, *, recompute: bool
                   ) -> tuple[CostModel, float, list[float]]:
    """(cost model in seconds, activation bytes of one microbatch-chunk, static bytes per
    rank) for ``schedule``."""
    shape, hw, model = config.shape, config.hardware, config.shape.model
    fam = family(schedule)
    chunks = fam.default_chunks
    stages = config.pp * chunks
    if model.num_layers % stages:
        raise ValueError(f"--num-layers {model.num_layers} is not divisible by pp x chunks "
                         f"= {stages} (schedule {schedule})")
    layers = model.num_layers // stages
    tp = config.tp
    flops_f, flops_b, flops_w = model.layer_flops(shape.micro_batch_size, shape.seq_length)
    speed = hw.peak_tflops * 1e12 * hw.mfu * tp  # one tp rank does 1/tp of the FLOPs
    tokens, h = shape.seq_length * shape.micro_batch_size, model.hidden_size
    comm_f, comm_b, comm_w = tensor_parallel_comm_seconds(
        tokens=tokens, hidden=h, bytes_per_value=shape.bytes_per_value, tp=tp,
        link_bytes_per_s=(hw.tp_link_gbps or 0.0) * GB,
        sequence_parallel=config.sequence_parallel,
        keep_sp_input_for_w=config.keep_sp_input_for_w)
    t_f = layers * (flops_f / speed + comm_f)
    t_b = layers * (flops_b / speed + comm_b) + (0.05 * t_f if recompute else 0.0)
    t_w = layers * (flops_w / speed + comm_w)
    chunk_bytes = layers * layer_activation_bytes(
        shape, recompute=recompute, tp=tp, sequence_parallel=config.sequence_parallel)
    # --keep-sp-input-for-w: B gathers the two column-parallel inputs, W frees them
    kept = (2 * (1 - 1 / tp) * tokens * h * shape.bytes_per_value * layers / chunk_bytes
            if config.keep_sp_input_for_w else 0.0)
    costs = CostModel(t_f=t_f, t_b=t_b, t_w=t_w, t_comm=0.0,
                      offload_bandwidth=hw.host_link_gbps * GB / chunk_bytes,
                      mem_f=1.0, mem_b=kept, mem_w=-1.0 - kept)
    layer_params, embedding = model.layer_params() / tp, model.vocab_size * h / tp
    static = [float(planned_state_bytes(
        [layers * layer_params + embedding * (stage in (0, stages - 1))
         for stage in rank_stages(fam.placement, config.pp, chunks, rank)], dp=config.dp))
        for rank in range(config.pp)]
    return costs, chunk_bytes, static


def candidate_request(config: TunerConfig, name: str, *,
                      offload_chunks: tuple[int, ...] = ()) -> ScheduleRequest:
    """The compute-only request of the schedule ``pretrain_gpt.py`` builds for this
    candidate (build it with ``config.plan_costs``, the frontend's planning cost model)."""
    return ScheduleRequest.of(name, pp=config.pp, num_microbatches=config.num_microbatches,
                              offload_chunks=list(offload_chunks), communication=False)


def _evaluate(config: TunerConfig, name: str, chunks: tuple[int, ...],
              recompute: bool) -> OffloadChoice:
    costs, chunk_bytes, static = estimate_costs(config, name, recompute=recompute)
    schedule = build(candidate_request(config, name, offload_chunks=chunks), config.plan_costs)
    result = simulate(schedule, costs)
    peaks = [static[r] + result.peak_activation[r] * chunk_bytes for r in range(config.pp)]
    peak = max(peaks)
    return OffloadChoice(schedule=name, num_chunks=schedule.num_chunks, offload_chunks=chunks,
                     recompute=recompute, step_s=result.makespan, peak_memory_gb=peak / GB,
                     fits=peak <= config.budget_bytes, bubble_rate=result.bubble_rate,
                     flags=training_flags(config, name, offload_chunks=chunks,
                                          recompute=recompute),
                     per_rank_peak_gb=[p / GB for p in peaks], tp=config.tp, pp=config.pp,
                     sequence_parallel=config.sequence_parallel,
                     keep_sp_input_for_w=config.keep_sp_input_for_w)


def _offload_sets(num_chunks: int) -> list[tuple[int, ...]]:
    return [c for size in range(1, num_chunks + 1)
            for c in itertools.combinations(range(num_chunks), size)]


def tune(config: TunerConfig) -> list[OffloadChoice]:
    """Every candidate, best first: those that fit the budget by predicted step time,
    then those that do not by peak memory."""
    candidates = []
    for recompute in (False, True):
        for name in config.schedules:
            fam = family(name)
            if config.shape.model.num_layers % (config.pp * fam.default_chunks) or \
                    config.num_microbatches < fam.microbatches_per_rank * config.pp:
                continue
            for chunks in _offload_sets(fam.default_chunks) if fam.offloads else [()]:
                candidates.append(_evaluate(config, name, chunks, recompute))
    if not candidates:
        raise ValueError(f"--num-layers {config.shape.model.num_layers} is not divisible by pp "
                         f"{config.pp} (or 2 x pp) for any schedule")
    return sorted(candidates, key=lambda c: (not c.fits, c.step_s if c.fits
                                             else c.peak_memory_gb))


def tune_devices(config: TunerConfig, *, devices: int, tp_sizes: tuple[int, ...]
                 ) -> list[OffloadChoice]:
    """TP against PP (+ offload) at equal device count and memory budget: every candidate
    of :func:`tune` for each tp size with ``pp = devices / tp`` (tp > 1: sequence
    parallel, W's inputs re-gathered or kept), ranked together. Sizes that do not divide
    the devices, the heads or the layers are skipped."""
    from dataclasses import replace

    candidates = []
    for tp in sorted(set(tp_sizes)):
        if tp < 1 or devices % tp or config.shape.model.num_attention_heads % tp or \
                config.shape.model.query_groups % tp:
            continue
        pp = devices // tp
        if config.num_microbatches < pp:
            continue
        variants = [(False, False)] if tp == 1 else [(True, False), (True, True)]
        for sequence_parallel, keep in variants:
            sized = replace(config, tp=tp, pp=pp, sequence_parallel=sequence_parallel,
                            keep_sp_input_for_w=keep)
            try:
                candidates += tune(sized)
            except ValueError:  # no schedule divides the layers at this pp
                continue
    if not candidates:
        raise ValueError(f"no tensor-parallel size of {sorted(tp_sizes)} divides "
                         f"--devices {devices}, the heads and the layers")
    return sorted(candidates, key=lambda c: (not c.fits, c.step_s if c.fits
                                             else c.peak_memory_gb))


def format_ranking(candidates: list[OffloadChoice], *, budget_gb: float, top: int = 15) -> str:
    header = (f"{'#':>3} {'tp':>2} {'pp':>3} {'schedule':<12} {'offload chunks':<14} "
              f"{'recompute':<9} {'step (ms)':>10} {'peak (GB)':>10} {'bubble':>7} fits")
    lines = [f"memory budget per rank: {budget_gb:.1f} GB", header, "-" * len(header)]
    for rank, c in enumerate(candidates[:top], 1):
        chunks = ",".join(map(str, c.offload_chunks)) or "-"
        tp = f"{c.tp}{'s' if c.sequence_parallel else ''}{'k' if c.keep_sp_input_for_w else ''}"
        lines.append(f"{rank:>3} {tp:>2} {c.pp:>3} {c.schedule:<12} {chunks:<14} "
                     f"{'lgd' if c.recompute else 'no':<9} {c.step_s * 1e3:>10.2f} "
                     f"{c.peak_memory_gb:>10.2f} {c.bubble_rate:>7.3f} "
                     f"{'yes' if c.fits else 'NO'}")
    return "\n".join(lines)


def measure_hardware(*, memory_gb: float, seconds: float = 1.0) -> Hardware:
    """Measured matmul throughput and host-memory copy bandwidth of this machine
    (CUDA device when available; ``mfu`` is 1 because the matmul speed is achieved)."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    size = 2048 if device == "cuda" else 512
    a = torch.randn(size, size, device=device, dtype=dtype)
    flops, start = 0.0, time.perf_counter()
    while time.perf_counter() - start < seconds / 2:
        a @ a
        flops += 2 * size ** 3
    if device == "cuda":
        torch.cuda.synchronize()
    tflops = flops / (time.perf_counter() - start) / 1e12
    host = torch.empty(64 * 2 ** 20, dtype=torch.uint8)
    src = torch.ones(64 * 2 ** 20, dtype=torch.uint8, device=device)
    moved, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds / 2:
        host.copy_(src)
        moved += host.numel()
    gbps = moved / (time.perf_counter() - start) / GB
    return Hardware(name=f"measured-{device}", peak_tflops=tflops, memory_gb=memory_gb,
                    host_link_gbps=gbps, mfu=1.0)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="odc-pp tune-offload", description=(
        "Rank schedules x offload ratio x recompute by predicted step time within a "
        "device memory budget (see odc_pp/schedule/offload_tuner.py for the formulas)."))
    p.add_argument("--num-layers", type=bounded_int(1, 100000), required=True)
    p.add_argument("--hidden-size", type=bounded_int(1, 10 ** 6), required=True)
    p.add_argument("--num-attention-heads", type=bounded_int(1, 10 ** 5), required=True)
    p.add_argument("--seq-length", type=bounded_int(1, 10 ** 8), required=True)
    p.add_argument("--micro-batch-size", type=bounded_int(1, 10 ** 5), default=1)
    p.add_argument("--vocab-size", type=bounded_int(1, 10 ** 8), default=32000)
    p.add_argument("--ffn-hidden-size", type=bounded_int(1, 10 ** 7), default=None,
                   help="MLP width (default: 4 x --hidden-size)")
    p.add_argument("--swiglu", action="store_true", help="gated MLP (3 h f weights)")
    p.add_argument("--group-query-attention", action="store_true")
    p.add_argument("--num-query-groups", type=bounded_int(1, 10 ** 5), default=None,
                   help="key/value heads under --group-query-attention")
    p.add_argument("--kv-channels", type=bounded_int(1, 10 ** 5), default=None,
                   help="channels per head (default: hidden / heads)")
    p.add_argument("--untie-embeddings-and-output-weights", dest="untie_embeddings",
                   action="store_true")
    p.add_argument("--no-flash-attention", action="store_true",
                   help="count the 5as/h attention-matrix activations")
    p.add_argument("--pp", type=bounded_int(1, MAX_PP), default=None,
                   help="pipeline ranks (or give --devices to rank tensor parallelism too)")
    p.add_argument("--devices", type=bounded_int(1, MAX_PP * 64), default=None,
                   help="devices per replica: rank every tp size of --tp-sizes at pp = "
                        "devices / tp")
    p.add_argument("--tp-sizes", default="1,2,4,8",
                   help="tensor-parallel sizes tried with --devices (comma-separated)")
    p.add_argument("--tp-link-gbps", type=bounded_float(0, 1e6, open_low=True), default=None,
                   help="NVLink bandwidth between tp ranks, GB/s (default: the preset's)")
    p.add_argument("--dp", type=bounded_int(1, 10 ** 6), default=1,
                   help="data-parallel ranks (optimizer sharding)")
    p.add_argument("--num-microbatches", type=bounded_int(1, MAX_MICROBATCHES), required=True)
    p.add_argument("--preset", choices=sorted(PRESETS), default=None)
    p.add_argument("--measure", action="store_true", help="measure this machine instead")
    p.add_argument("--memory-budget-gb", type=bounded_float(0, 1e6, open_low=True), default=None,
                   help="usable memory per rank (default: the device's)")
    p.add_argument("--cost-model", default=None, metavar="FILE",
                   help="the CostModel JSON file pretrain_gpt.py will get as --cost-model "
                        "(it plans the schedule; default: none, the frontend's default)")
    p.add_argument("--mfu", type=bounded_float(0, 1, open_low=True), default=None,
                   help="override the MFU factor")
    p.add_argument("--top", type=bounded_int(1, 10000), default=15, help="rows to print")
    p.add_argument("--json", action="store_true", help="print the ranking as JSON")
    return p


def _plan_costs(path: str | None) -> CostModel:
    if path is None:
        return CostModel()
    try:
        with open(path, encoding="utf-8") as handle:
            return CostModel.from_dict(json.load(handle))
    except (OSError, json.JSONDecodeError, TypeError, ValueError) as exc:
        raise ValueError(f"--cost-model {path!r}: {exc}") from exc


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.measure == (args.preset is not None):
            raise ValueError("give exactly one of --preset {a100,h100,h200} and --measure")
        if args.measure:
            hardware = measure_hardware(memory_gb=args.memory_budget_gb or 16.0)
        else:
            hardware = PRESETS[args.preset]
        from dataclasses import replace

        if args.mfu is not None:
            hardware = replace(hardware, mfu=args.mfu)
        if args.tp_link_gbps is not None:
            hardware = replace(hardware, tp_link_gbps=args.tp_link_gbps)
        if (args.pp is None) == (args.devices is None):
            raise ValueError("give exactly one of --pp (pipeline only) and --devices "
                             "(tensor and pipeline parallelism ranked together)")
        check_work(args.pp or args.devices, args.num_microbatches, 2)  # V schedules: 2 chunks
        model = ModelShape.of(args, args.vocab_size)
        shape = Workload(model=model, seq_length=args.seq_length,
                         micro_batch_size=args.micro_batch_size,
                         flash_attention=not args.no_flash_attention)
        config = TunerConfig(shape=shape, hardware=hardware, pp=args.pp or 1, dp=args.dp,
                             num_microbatches=args.num_microbatches,
                             memory_budget_gb=args.memory_budget_gb,
                             plan_costs=_plan_costs(args.cost_model),
                             plan_costs_path=args.cost_model)
        if args.devices is None:
            ranking = tune(config)
        else:
            sizes = tuple(int(x) for x in args.tp_sizes.split(",") if x.strip())
            ranking = tune_devices(config, devices=args.devices, tp_sizes=sizes)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    budget = config.budget_bytes / GB
    if args.json:
        print(json.dumps([c.__dict__ for c in ranking[:args.top]], indent=1))
    else:
        print(f"hardware: {hardware}")
        print(format_ranking(ranking, budget_gb=budget, top=args.top))
    best = ranking[0]
    if not best.fits:
        print(f"error: no schedule fits {budget:.1f} GB per rank; the smallest needs "
              f"{best.peak_memory_gb:.1f} GB ({best.schedule}, offload chunks "
              f"{list(best.offload_chunks) or 'none'}, recompute "
              f"{'lgd' if best.recompute else 'off'}). "
              "Raise --memory-budget-gb, --pp or --dp, or lower --micro-batch-size / "
              "--seq-length.", file=sys.stderr)
        return 2
    if not args.json:
        print(f"\nbest: {' '.join(best.flags)}\n  (on {best.tp * best.pp * config.dp} ranks, add "
              f"the data flags; predicted {best.step_s * 1e3:.2f} ms/step, peak "
              f"{best.peak_memory_gb:.2f} GB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
