"""``odc-pp tune-offload``: pick the pipeline schedule, activation-offload ratio and
recompute option with the best predicted step time that fits a device memory budget.

A view of the planner (:mod:`odc_pp.planner.search`) with tp and pp fixed and every
sample at ``--seq-length``: one search, one cost model, one memory model. The view gives
the planner its own axes as explicit candidates (:func:`candidates_of`): every
deterministic schedule family of the registry (``odc_pp.schedule.generators.families``;
zb-auto is left out: training re-plans it from measured costs, so the simulated order is
not what runs), with and without ``--recompute-lgd``, for a family that offloads every
non-empty set of ``--offload-chunks``, and at tp > 1 with W's sequence-parallel inputs
re-gathered or kept (``--keep-sp-input-for-w``). :func:`odc_pp.planner.search.rank`
predicts each as ``odc-pp plan`` does:

* F/B/W seconds: the FLOPs a layer executes (:meth:`ModelShape.executed_layer_flops`:
  ``2 b s (2 h q + 2 h k + 2 h f)`` in each of F, B and W, ``3 h f`` with SwiGLU, plus
  causal attention ``2 b s^2 q`` in F and twice that in B, half of Megatron-LM's
  formula, which MFU keeps) over the cluster's achieved FLOP/s
  (:meth:`Hardware.flops_per_s`), divided by tp, plus the tensor-parallel collectives;
  the output layer on the last stage; recomputing layernorm/GeLU/dropout adds 5 % of
  the forward time to B.
* the schedule ``pretrain_gpt.py`` builds from the printed flags (its ``--cost-model``,
  passed here as ``--cost-model``), simulated, with the stage transfers, each offloaded
  microbatch-chunk's activations crossing the host link (``--preset``'s PCIe figure) and
  the optimizer step of the rank's shard added.
* memory per rank: model state (bf16 parameters, fp32 gradients, fp32 master + Adam
  sharded over dp; the embedding on the first stage, the output layer on the last) plus
  the simulator's activation peak (what an OFFLOAD moved out does not count until its
  RELOAD) times a microbatch-chunk's bytes
  (:func:`odc_pp.planner.memory.layer_activation_bytes`: the bytes the dry run measured
  for the layer's kind, ``odc_pp/planner/layer_activations.json``),
  and the last stage's fp32 logits.

Hardware: a preset of :mod:`odc_pp.planner.hardware` (``--preset``), or ``--measure``
instead times a matmul and a host-memory copy on this machine (links between GPUs are then
unknown and not costed). ``--devices N --tp-sizes 1,2,4,8`` ranks each tp size at
``pp = N / tp`` together.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace

import numpy as np

from odc_pp.layout import DataParallelMode
from odc_pp.schedule.cli_bounds import (MAX_MICROBATCHES, MAX_PP, MAX_WORK, bounded_float,
                                        bounded_int, check_work)
from odc_pp.schedule.costs import CostModel
from odc_pp.schedule.generators import FAMILIES, family

from .chunks import MAX_CHUNKS, chunk_layouts, offload_sets
from .config import Candidate, PlanConfig, Prediction
from .hardware import GB, PRESETS, Hardware, memory_budget_gb
from .inputs import ModelSpec
from .memory import Workload
from .offload_report import describe_hardware, format_ranking
from .model import ModelShape
from .search import rank

__all__ = ["OffloadChoice", "TunerConfig", "tune", "tune_devices", "plan_config",
           "candidates_of", "format_ranking", "measure_hardware", "main"]



@dataclass(kw_only=True)
class TunerConfig:
    """What to tune for."""

    shape: Workload
    """Model shape, sequence length (every sample's) and microbatch size."""
    hardware: Hardware
    """Compute speed and links."""
    pp: int
    """Pipeline ranks."""
    num_microbatches: int
    """Microbatches per iteration (per data-parallel rank)."""
    dp: int = 1
    """Data-parallel ranks sharing the optimizer state (ODC)."""
    memory_budget_gb: float | None = None
    """Usable device memory per rank, GB (default: :func:`~.hardware.memory_budget_gb` of
    ``hardware``, the budget of ``odc-pp plan`` and the dry run)."""
    schedules: tuple[str, ...] = tuple(f.name for f in FAMILIES if not f.searched)
    """Schedule families tried (registry names; an offloading family is tried with every
    non-empty set of offload chunks)."""
    plan_costs: CostModel = field(default_factory=CostModel)
    """Cost model the training frontend builds schedules with: its ``--cost-model`` file
    (default: the frontend's default, ``CostModel()``)."""
    plan_costs_path: str | None = None
    """Path of that ``--cost-model`` file, repeated in the printed flags (None: no file)."""
    tp: int = 1
    """Tensor-parallel ranks per stage (tp > 1 runs sequence parallel, as the planner
    plans it)."""
    keep_sp_input_for_w: bool = False
    """``--keep-sp-input-for-w`` (needs tp > 1)."""
    model_flags: tuple[str, ...] = ()
    """Model flags every candidate's flags repeat (``--hf-checkpoint DIR --seq-length N``
    of ``--hf-config``); empty: rebuilt from ``shape``."""
    rank_memory: Callable[[list[str], int], list[float]] | None = None
    """(a candidate's flags, GPUs) -> peak bytes per pipeline rank: ``odc-pp
    tune-offload`` gives the dry run's memory model, as ``odc-pp plan`` does; None: the
    planner's own estimate (:mod:`odc_pp.planner.rough_memory`)."""
    num_chunks: int | None = None
    """``--num-model-chunks`` of the families that take any count (interleaved, offload);
    None: every count of the planner's chunk axis (:func:`~.chunks.chunk_layouts`)."""

    def __post_init__(self) -> None:
        heads = self.shape.model.num_attention_heads
        if self.tp < 1 or heads % self.tp or self.shape.model.query_groups % self.tp:
            raise ValueError(f"tensor-parallel size {self.tp} must be >= 1 and divide "
                             f"--num-attention-heads {heads} and the query groups")
        if self.keep_sp_input_for_w and self.tp == 1:
            raise ValueError("keeping W's inputs needs a tensor-parallel size > 1")
        if self.tp > 1 and self.hardware.tp_link_gbps is None:
            raise ValueError("tensor parallelism needs the NVLink bandwidth: use a --preset "
                             "or give --tp-link-gbps")
        if self.pp < 1 or self.num_microbatches < 1 or self.dp < 1:
            raise ValueError("--pp, --num-microbatches and --dp must be >= 1")
        if self.num_chunks is not None and self.num_chunks < 1:
            raise ValueError(f"--num-model-chunks must be >= 1, got {self.num_chunks}")
        if self.num_microbatches < self.pp:
            raise ValueError(f"--num-microbatches {self.num_microbatches} must be >= --pp "
                             f"{self.pp}")
        if self.memory_budget_gb is not None and not (
                np.isfinite(self.memory_budget_gb) and self.memory_budget_gb > 0):
            raise ValueError(f"--memory-budget-gb must be a finite number > 0, got "
                             f"{self.memory_budget_gb}")
        for name in self.schedules:
            if family(name).searched:
                raise ValueError(f"schedule {name} is re-planned from measured costs during "
                                 f"training, so the simulated order is not what runs; it "
                                 f"cannot be tuned")

    @property
    def budget_bytes(self) -> float:
        return memory_budget_gb(self.hardware, self.memory_budget_gb) * GB


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
    """The planner's predicted step (pipeline, data-parallel traffic, optimizer)."""
    peak_memory_gb: float
    """Largest per-rank peak (model state + activations)."""
    fits: bool
    """The peak fits the memory budget."""
    bubble_rate: float
    """Idle share of the busiest rank's pipeline span."""
    flags: list[str] = field(default_factory=list)
    """``pretrain_gpt.py`` flags that build exactly this candidate's schedule (add the
    data flags and run on tp x pp x dp ranks)."""
    per_rank_peak_gb: list[float] = field(default_factory=list)
    """Per-rank peaks."""
    tp: int = 1
    """Tensor-parallel size (with pp, the devices of one replica: tp x pp)."""
    pp: int = 1
    """Pipeline size."""
    sequence_parallel: bool = False
    keep_sp_input_for_w: bool = False
    breakdown: dict[str, float] = field(default_factory=dict)
    """The planner's step breakdown (seconds): compute, bubble, dp_wait, comm, optimizer."""


def plan_config(config: TunerConfig) -> PlanConfig:
    """The planner's inputs of this view: one replica layout (tp, pp, dp) of ODC, every
    sample ``--seq-length`` long, ``micro batch x microbatches x dp`` samples a step."""
    shape = config.shape
    model = ModelSpec(**{f.name: getattr(shape.model, f.name) for f in fields(ModelShape)},
                      seq_length=shape.seq_length, source_flags=config.model_flags)
    return PlanConfig(model=model, cluster=config.hardware,
                      gpus=config.tp * config.pp * config.dp,
                      global_batch=shape.micro_batch_size * config.num_microbatches * config.dp,
                      lengths=np.array([shape.seq_length]),
                      memory_gb=config.budget_bytes / GB, tp_sizes=(config.tp,),
                      schedules=config.schedules, dp_modes=(DataParallelMode.ODC,), samples=1,
                      flash_attention=shape.flash_attention, plan_costs=config.plan_costs,
                      plan_costs_path=config.plan_costs_path, rank_memory=config.rank_memory)


def candidates_of(config: TunerConfig) -> list[Candidate]:
    """The view's candidates: schedule family x model chunks x offload chunks x
    recompute at the config's tp, pp and dp (model chunks: ``num_chunks`` or the
    planner's chunk axis, :func:`~.chunks.chunk_layouts`, with its stage layouts: equal,
    the embedding / loss accounted in the split, or lighter ends; offload chunks:
    :func:`~.chunks.offload_sets`; counts that do not split the layers, or families that
    need more microbatches, are left out; at pp = 1 only 1f1b: with one stage every
    schedule is the same, as in the planner's own candidates)."""
    out = []
    layers = config.shape.model.num_layers
    for recompute in (False, True):
        for name in config.schedules:
            fam = family(name)
            if config.num_microbatches < fam.microbatches_per_rank * config.pp:
                continue
            if config.pp == 1 and name != "1f1b":
                continue  # one stage: every schedule is the same (the planner's rule)
            layouts = chunk_layouts(name, layers, config.pp)
            if config.num_chunks is not None and fam.max_chunks is None:
                layouts = [layout for layout in layouts if layout[0] == config.num_chunks]
                if not fam.accepts_chunks(config.num_chunks) or not layouts:
                    raise ValueError(f"--num-model-chunks {config.num_chunks}: --num-layers "
                                     f"{layers} must be divisible by pp {config.pp} x "
                                     f"{config.num_chunks} ({name}), with the embedding "
                                     f"and loss accounted in the split, or split with "
                                     f"lighter first and last stages")
            for num_chunks, uneven, accounted in layouts:
                if config.pp * config.num_microbatches * num_chunks > MAX_WORK:
                    continue  # the schedule CLIs' bound on one schedule's work
                for chunks in offload_sets(num_chunks) if fam.offloads else [None]:
                    out.append(Candidate(
                        tp=config.tp, pp=config.pp, dp=config.dp, schedule=name,
                        dp_mode=DataParallelMode.ODC, balance="none", packed=False,
                        token_cap=None, recompute=recompute,
                        micro_batch=config.shape.micro_batch_size, offload_chunks=chunks,
                        keep_sp_input_for_w=config.keep_sp_input_for_w, chunks=num_chunks,
                        uneven=uneven, accounted=accounted))
    return out


def _choice(pred: Prediction) -> OffloadChoice:
    cand, parts = pred.candidate, pred.breakdown
    span = parts["compute"] + parts["bubble"]
    return OffloadChoice(schedule=cand.schedule, num_chunks=cand.num_chunks,
                         offload_chunks=cand.offloaded, recompute=cand.recompute,
                         step_s=pred.step_s, peak_memory_gb=max(pred.peak_memory_gb),
                         fits=pred.fits, bubble_rate=parts["bubble"] / span if span else 0.0,
                         flags=pred.flags, per_rank_peak_gb=list(pred.peak_memory_gb),
                         tp=cand.tp, pp=cand.pp, sequence_parallel=cand.tp > 1,
                         keep_sp_input_for_w=cand.keep_sp_input_for_w, breakdown=dict(parts))


def tune(config: TunerConfig) -> list[OffloadChoice]:
    """Every candidate, best first (the planner's order): those that fit the budget by
    predicted step time, then those that do not by peak memory."""
    cands = candidates_of(config)
    if not cands:
        chunks = "" if config.num_chunks is None else \
            f" (or pp x --num-model-chunks {config.num_chunks})"
        raise ValueError(f"--num-layers {config.shape.model.num_layers} is not divisible by pp "
                         f"{config.pp} (or 2 x pp){chunks} for any schedule")
    return [_choice(pred) for pred in rank(plan_config(config), cands, refine=None)]


def tune_devices(config: TunerConfig, *, devices: int, tp_sizes: tuple[int, ...]
                 ) -> list[OffloadChoice]:
    """TP against PP (+ offload) at equal device count and memory budget: every candidate
    of :func:`tune` for each tp size with ``pp = devices / tp`` (tp > 1: sequence
    parallel, W's inputs re-gathered or kept), ranked together. Sizes that do not divide
    the devices, the heads or the layers are skipped."""
    candidates = []
    for tp in sorted(set(tp_sizes)):
        if tp < 1 or devices % tp or config.shape.model.num_attention_heads % tp or \
                config.shape.model.query_groups % tp:
            continue
        pp = devices // tp
        if config.num_microbatches < pp:
            continue
        for keep in [False] if tp == 1 else [False, True]:
            sized = replace(config, tp=tp, pp=pp, keep_sp_input_for_w=keep)
            try:
                candidates += tune(sized)
            except ValueError:  # no schedule divides the layers at this pp
                continue
    if not candidates:
        raise ValueError(f"no tensor-parallel size of {sorted(tp_sizes)} divides "
                         f"--devices {devices}, the heads and the layers")
    return sorted(candidates, key=lambda c: (not c.fits, c.step_s if c.fits
                                             else c.peak_memory_gb))


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


def _sizes(text: str) -> tuple[int, ...]:
    """``--tp-sizes 1,2,4``: integers >= 1."""
    try:
        sizes = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1, got "
                                         f"{text!r}")
    return sizes


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="odc-pp tune-offload", description=(
        "Rank schedules x offload ratio x recompute by predicted step time within a "
        "device memory budget (see odc_pp/schedule/offload_tuner.py for the formulas)."))
    p.add_argument("--hf-config", default=None, metavar="PATH",
                   help="HF config.json (or its directory) of the model, read as odc-pp plan "
                        "--hf-config reads it, instead of the shape flags; the printed flags "
                        "train it with --hf-checkpoint")
    p.add_argument("--num-layers", type=bounded_int(1, 100000), default=None,
                   help="(without --hf-config: the shape flags below are Megatron's)")
    p.add_argument("--hidden-size", type=bounded_int(1, 10 ** 6), default=None)
    p.add_argument("--num-attention-heads", type=bounded_int(1, 10 ** 5), default=None)
    p.add_argument("--seq-length", type=bounded_int(1, 10 ** 8), default=None,
                   help="every sample's length (with --hf-config: default its "
                        "max_position_embeddings)")
    p.add_argument("--micro-batch-size", type=bounded_int(1, 10 ** 5), default=1)
    p.add_argument("--vocab-size", type=bounded_int(1, 10 ** 8), default=None,
                   help="vocabulary rows (default 32000; with --hf-config: its vocab_size)")
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
    p.add_argument("--normalization", choices=("LayerNorm", "RMSNorm"), default=None,
                   help="the layers' norm (default LayerNorm, Megatron's)")
    p.add_argument("--position-embedding-type", choices=("learned_absolute", "rope"),
                   default=None, help="positions (default learned_absolute, Megatron's)")
    p.add_argument("--no-flash-attention", action="store_true",
                   help="count the 5as/h attention-matrix activations")
    p.add_argument("--pp", type=bounded_int(1, MAX_PP), default=None,
                   help="pipeline ranks (or give --devices to rank tensor parallelism too)")
    p.add_argument("--devices", type=bounded_int(1, MAX_PP * 64), default=None,
                   help="devices per replica: rank every tp size of --tp-sizes at pp = "
                        "devices / tp")
    p.add_argument("--tp-sizes", type=_sizes, default=(1, 2, 4, 8),
                   help="tensor-parallel sizes tried with --devices (comma-separated)")
    p.add_argument("--tp-link-gbps", type=bounded_float(0, 1e6, open_low=True), default=None,
                   help="NVLink bandwidth between tp ranks, GB/s (default: the preset's)")
    p.add_argument("--num-model-chunks", type=bounded_int(1, MAX_CHUNKS), default=None,
                   help="model chunks per rank of interleaved and offload (default: every "
                        f"count up to {MAX_CHUNKS} that splits the layers as Megatron does: "
                        "evenly, with the embedding and loss accounted in the split, or "
                        "with lighter first and last stages)")
    p.add_argument("--dp", type=bounded_int(1, 10 ** 6), default=1,
                   help="data-parallel ranks (optimizer sharding)")
    p.add_argument("--num-microbatches", type=bounded_int(1, MAX_MICROBATCHES), required=True)
    p.add_argument("--preset", choices=sorted(PRESETS), default=None)
    p.add_argument("--measure", action="store_true", help="measure this machine instead")
    p.add_argument("--memory-budget-gb", type=bounded_float(0, 1e6, open_low=True), default=None,
                   help="usable memory per rank, GB (default: 90%% of the device's, as "
                        "odc-pp plan and the dry run)")
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


_SHAPE_FLAGS = ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size",
                "swiglu", "group_query_attention", "num_query_groups", "kv_channels",
                "untie_embeddings", "vocab_size", "normalization", "position_embedding_type")


def _model(args, load_hf: Callable[..., ModelSpec] | None) -> tuple[ModelShape, int,
                                                                     tuple[str, ...]]:
    """(shape, sequence length, model flags to repeat) of ``--hf-config`` or the shape
    flags (one of them)."""
    if args.hf_config is None:
        missing = [f"--{name.replace('_', '-')}" for name in
                   ("num_layers", "hidden_size", "num_attention_heads", "seq_length")
                   if getattr(args, name) is None]
        if missing:
            raise ValueError(f"give --hf-config or the model's shape: {', '.join(missing)} "
                             f"missing")
        if args.vocab_size is None:
            args.vocab_size = 32000
        return ModelShape.of(args, args.vocab_size), args.seq_length, ()
    given = [f"--{name.replace('_', '-')}" for name in _SHAPE_FLAGS
             if getattr(args, name) not in (None, False)]
    if given:
        raise ValueError(f"--hf-config {args.hf_config} gives the model's shape: drop "
                         f"{', '.join(given)}")
    if load_hf is None:
        raise ValueError("--hf-config needs the odc-pp tune-offload command "
                         "(odc_pp.training.tune_offload_command), which reads HF configs")
    try:
        spec = load_hf(args.hf_config, seq_length=args.seq_length)
    except (OSError, KeyError, TypeError) as exc:
        raise ValueError(f"--hf-config {args.hf_config}: {exc}") from exc
    shape = ModelShape(**{f.name: getattr(spec, f.name) for f in fields(ModelShape)})
    return shape, spec.seq_length, tuple(spec.source_flags)


def _hardware(args) -> Hardware:
    if args.measure == (args.preset is not None):
        raise ValueError("give exactly one of --preset {a100,h100,h200} and --measure")
    hardware = measure_hardware(memory_gb=args.memory_budget_gb or 16.0) if args.measure \
        else PRESETS[args.preset]
    if args.mfu is not None:
        hardware = replace(hardware, mfu=args.mfu)
    if args.tp_link_gbps is not None:
        hardware = replace(hardware, tp_link_gbps=args.tp_link_gbps)
    return hardware


def main(argv: list[str] | None = None, *,
         rank_memory: Callable[[list[str], int], list[float]] | None = None,
         load_hf: Callable[..., ModelSpec] | None = None) -> int:
    """The command (``odc_pp.training.tune_offload_command`` passes the dry run's memory
    model as ``rank_memory``, without it the planner's own estimate, and ``odc-pp plan``'s
    HF config loader as ``load_hf``)."""
    args = _parser().parse_args(argv)
    try:
        hardware = _hardware(args)
        if (args.pp is None) == (args.devices is None):
            raise ValueError("give exactly one of --pp (pipeline only) and --devices "
                             "(tensor and pipeline parallelism ranked together)")
        check_work(args.pp or args.devices, args.num_microbatches,
                   max(2, args.num_model_chunks or 2))  # V schedules: 2 chunks
        model, seq_length, model_flags = _model(args, load_hf)
        shape = Workload(model=model, seq_length=seq_length,
                         micro_batch_size=args.micro_batch_size,
                         flash_attention=not args.no_flash_attention)
        config = TunerConfig(shape=shape, hardware=hardware, pp=args.pp or 1, dp=args.dp,
                             num_microbatches=args.num_microbatches,
                             memory_budget_gb=args.memory_budget_gb,
                             plan_costs=_plan_costs(args.cost_model),
                             plan_costs_path=args.cost_model, rank_memory=rank_memory,
                             model_flags=model_flags, num_chunks=args.num_model_chunks)
        if args.devices is None:
            ranking = tune(config)
        else:
            ranking = tune_devices(config, devices=args.devices, tp_sizes=args.tp_sizes)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    budget = config.budget_bytes / GB
    if args.json:
        print(json.dumps([c.__dict__ for c in ranking[:args.top]], indent=1))
    else:
        print(f"hardware: {describe_hardware(hardware)}")
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
