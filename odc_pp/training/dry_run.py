"""Memory dry run: one rank of an N-rank job at real model size, without its memory.

``pretrain_gpt.py <flags> --dry-run --dry-run-rank R --dry-run-world-size N`` (or
``odc-pp memory <flags> --dry-run-rank R --dry-run-world-size N``) builds rank R's real
model chunks (``odc_pp.megatron``), its real ODC engine and sharded AdamW on a fake ODC
group (:class:`~odc_pp.odc.transport_fake.FakeOdcGroup`) and its tensor-parallel groups
on torch's ``fake`` process-group backend, all under ``FakeTensorMode`` (no bytes are
allocated), and reports the rank's peak memory by category
(:data:`odc_pp.planner.memory.CATEGORIES`) as one table, whether it fits
the GPU's budget (:func:`~odc_pp.planner.hardware.memory_budget_gb`: ``--memory-gb``, else
90% of the HBM of ``--dry-run-gpu``, default h100: 72 GB; ``odc-pp plan`` judges with the
same budget) and, when not, which flags to change and their effect.
``--dry-run-json PATH`` writes ``{"job": report}`` (:data:`REPORT_KEY`).

What is measured and what is computed:

* measured with ``torch.distributed._tools.mem_tracker.MemTracker`` on fake tensors: one
  microbatch of each local chunk through F, B (weight gradients deferred through the
  runtime's WeightGradQueue) and W at the flags' sequence length and microbatch size --
  saved activations, W-held tensors, temporaries -- and the engine's push (flattened
  gradient, deterministic staging) and the post-validation snapshot;
* read from the real engine/optimizer tensors: parameter shards, gathered buffers,
  accumulators, optimizer state; the formulas of :func:`~odc_pp.planner.memory.
  state_bytes` are checked against them (``measured`` in the report; a mismatch above 1%
  raises);
* computed: the per-microbatch quantities are placed in time by walking this rank's
  lowered schedule (:func:`~odc_pp.planner.memory.schedule_peak`, with the
  simulator's times for send completion). The full pipeline is not executed: layers of a
  chunk are identical, so one microbatch per chunk gives every per-microbatch size.

Attention is measured with ``--attention-backend sdpa`` and the loss with
``--fused-cross-entropy on`` (what GPUs run under ``auto``) on CPU fake tensors: one causal sequence per microbatch (packed documents change only the mask).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import sys

import torch
import torch.distributed as dist
from torch import nn

from odc_pp.layout import ParallelLayout, layout_rank
from odc_pp.planner.hardware import DEFAULT_PRESET, GB, PRESETS, memory_budget_gb
from odc_pp.planner.memory import ChunkBytes, MemoryReport, UnitSizes, schedule_peak, state_bytes

from .arguments import TrainingArgs, parse_args
from .job import Job
from .plan_memory import (embedding_kept, job_costs, layer_bytes, param_residency,
                          replica_microbatches)

__all__ = ["DryRunFlags", "MemoryPhases", "gpu_model", "REPORT_KEY", "dry_run", "main",
           "split_dry_run_flags"]

REPORT_KEY = "job"
"""The one key of ``--dry-run-json``'s object: this job's report."""

_CPU = torch.device("cpu")


class DryRunFlags(argparse.Namespace):
    rank: int = 0
    world_size: int = 1
    gpu: str = DEFAULT_PRESET
    """--dry-run-gpu: the GPU kind whose budget the verdict uses."""
    memory_gb: float = memory_budget_gb(PRESETS[DEFAULT_PRESET])
    """The budget, GB: --memory-gb, else the one of --dry-run-gpu."""
    json: str | None = None
    receives_preposted: bool = False
    """Every receive of a minibatch is posted when it starts (the runtime does so on
    gloo); False: at its RECV action (NCCL)."""


def split_dry_run_flags(argv: list[str]) -> tuple[DryRunFlags, list[str]]:
    """(the dry run's own flags, the training flags)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--dry-run-rank", dest="rank", type=int, default=0)
    parser.add_argument("--dry-run-world-size", dest="world_size", type=int, default=None)
    parser.add_argument("--dry-run-gpu", dest="gpu", choices=sorted(PRESETS),
                        default=DEFAULT_PRESET)
    parser.add_argument("--memory-gb", dest="memory_gb", type=float, default=None)
    parser.add_argument("--dry-run-json", dest="json", default=None)
    flags, rest = parser.parse_known_args(argv, namespace=DryRunFlags())
    if flags.world_size is None:
        raise ValueError("--dry-run needs --dry-run-world-size N (the job's GPU count)")
    if not 0 <= flags.rank < flags.world_size:
        raise ValueError(f"--dry-run-rank {flags.rank} outside 0..{flags.world_size - 1}")
    flags.memory_gb = memory_budget_gb(PRESETS[flags.gpu], flags.memory_gb)
    return flags, rest


@contextlib.contextmanager
def _fake_module_to():
    """``nn.Module.to`` re-wraps parameters instead of swapping them (torch cannot swap
    fake tensors: the fake mode holds weak references to them)."""
    original = nn.Module.to

    def to(self, *args, **kwargs):
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)

        def convert(t):
            wanted = dtype if dtype is not None and t.is_floating_point() else t.dtype
            return t.detach().to(device=device or t.device, dtype=wanted)

        for module in self.modules():
            for name, param in list(module._parameters.items()):
                if param is not None:
                    new = nn.Parameter(convert(param), requires_grad=param.requires_grad)
                    new.__dict__.update(param.__dict__)
                    module._parameters[name] = new
            for name, buffer in list(module._buffers.items()):
                if buffer is not None:
                    module._buffers[name] = convert(buffer)
        return self

    nn.Module.to = to
    try:
        yield
    finally:
        nn.Module.to = original


@contextlib.contextmanager
def _fake_world(rank: int, world_size: int):
    """torch.distributed's fake backend for the dry run, destroyed on leaving when made
    here (a caller's own fake world of the same size is used and left as it is)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        if dist.get_backend() != "fake" or dist.get_world_size() != world_size:
            raise ValueError("the dry run needs its own process (a real process group is "
                             "initialised here)")
        yield
        return
    dist.init_process_group("fake", rank=rank, world_size=world_size, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


class MemoryPhases:
    """MemTracker entered once before anything is built (it counts a storage from the
    first op that produces it, so earlier tensors would be missed); :meth:`phase` gives
    the peak and the still-live bytes that a block added."""

    def __init__(self) -> None:
        from torch.distributed._tools.mem_tracker import MemTracker

        self.tracker = MemTracker()

    def __enter__(self):
        self.tracker.__enter__()
        # only the totals are wanted: its per-module statistics refuse a module called
        # once per microbatch
        self.tracker._mod_tracker.clear_user_hooks()
        return self

    def __exit__(self, *exc):
        self.tracker.__exit__(*exc)

    def now(self) -> int:
        return self.tracker.get_tracker_snapshot("current").get(_CPU, {}).get("Total", 0)

    @contextlib.contextmanager
    def phase(self):
        """Yields a dict that gets ``peak`` and ``live`` (bytes above the start)."""
        base = self.now()
        self.tracker._peak_mem = {_CPU: base}  # restart the peak at the phase
        result = {}
        yield result
        result["peak"] = max(0, self.tracker._peak_mem.get(_CPU, base) - base)
        result["live"] = self.now() - base


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def _topology(job: Job, rank: int):
    """Rank ``rank``'s Topology: every group made on the fake process group."""
    from .distributed import Topology

    return Topology.for_job(job, rank, _CPU)


def gpu_model(model):
    """The model flags (ModelArgs) the dry run builds: what a GPU runs under ``auto`` --
    the sdpa attention and the fused loss. The flash kernels apply attention dropout
    with their random state alone (no mask, no probabilities kept), which the CPU's
    sdpa would not (it falls back to the math path and keeps ``s x s`` probabilities),
    so the fake sdpa runs without attention dropout."""
    backend = model.attention_backend
    fused = model.fused_cross_entropy
    backend = "sdpa" if backend == "auto" else backend
    return dataclasses.replace(
        model, attention_backend=backend,
        fused_cross_entropy="on" if fused == "auto" else fused,
        attention_dropout=0.0 if backend == "sdpa" else model.attention_dropout)


def _build(job: Job, topo, vocab_size: int, residency: str, keep_embedding: bool = False):
    """This rank's chunks, engine and optimizer, made by the training builders on fake
    tensors, the fake process group and a fake ODC group (no --hf-checkpoint weights are
    read: only their sizes matter)."""
    from odc_pp.odc.transport_fake import FakeOdcGroup

    from .components import build_engine, build_model, build_optimizer

    args = job.args
    if not (job.layout.mode.is_odc or job.layout.mode.is_ddp):
        raise ValueError(f"--dry-run models --dp-mode odc and ddp; got --dp-mode "
                         f"{job.layout.mode}")
    model = gpu_model(args.model)
    with _fake_module_to():
        chunks = build_model(model, args.schedule, args.parallel, topo,
                             placement=job.placement, vocab_size=vocab_size,
                             seed=args.run.seed, load_weights=False)
    group = FakeOdcGroup(rank=topo.dp_rank, world_size=topo.dp,
                         deterministic=not args.parallel.nondeterministic_dp,
                         backend=job.layout.mode.transport)
    engine = build_engine(args.parallel, chunks, topo, param_dtype=args.model.compute_dtype,
                          odc_group=group, param_residency=residency,
                          keep_embedding=keep_embedding)
    # a model tied across stages: the output layer's copy stays out of the norm (its
    # gradient sum over the tie group, TiedGradients, is not made here)
    tied = any(chunk.tied_across_stages for chunk in chunks)
    optimizer = build_optimizer(args.optimizer, engine, topo, norm_group=topo.norm_group,
                                tied=tied)
    return chunks, engine, optimizer


def _microbatch(args: TrainingArgs, vocab_size: int):
    from odc_pp.data import Microbatch, row_token_ids

    packed = args.data.max_tokens_per_microbatch
    shape = (1, packed) if packed else (args.data.micro_batch_size, args.model.seq_length)
    tokens = torch.randint(0, vocab_size, shape)
    return Microbatch(tokens=tokens, labels=tokens.clone(), loss_mask=torch.ones(shape),
                      global_token_ids=row_token_ids(*shape))


def _measure_chunks(tracker, chunks, engine, schedule, pp_rank: int, microbatch) -> tuple[
        list[ChunkBytes], int, dict]:
    """Per local chunk: one microbatch through F, B (deferred wgrads), W and the push."""
    from odc_pp.runtime.wgrad import WeightGradQueue

    queue = WeightGradQueue()
    for index, chunk in enumerate(chunks):
        queue.attach(index, chunk)
    shape, dtype = chunks[0].input_shape(microbatch)
    message = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    sizes, pushes = [], {}
    for index, chunk in enumerate(chunks):
        stage = schedule.stage_of(pp_rank, index)
        last = stage == schedule.num_stages - 1
        engine.before_forward(index, 0)
        ahead = _layers_resident(engine)  # the first layer's gather, issued ahead
        hidden = None
        if stage > 0:
            shape, dtype = chunk.input_shape(microbatch)
            hidden = torch.empty(shape, dtype=dtype).requires_grad_()
        with tracker.phase() as forward:
            output = chunk(hidden, microbatch)
            if last:
                output = output.float().sum()
        ahead -= _layers_resident(engine)  # freed inside F: not a saved activation
        grad = None if last else torch.empty_like(output)
        with tracker.phase() as backward, queue.deferring(index, 0):
            torch.autograd.backward(output, grad_tensors=grad)
        del output, grad
        held = queue.pending_bytes(index, 0)
        with tracker.phase() as weight:
            queue.flush(index, 0)
        grads = _nbytes(p.grad for p in chunk.parameters())
        with tracker.phase() as push:
            engine.after_weight_grad(index, 0)
        pushes[index] = (push["peak"], grads)
        saved = forward["live"] + ahead + (message if hidden is not None else 0)
        sizes.append(ChunkBytes(
            saved=saved, w_held=held,
            transient_f=max(0, forward["peak"] - forward["live"]),
            transient_b=backward["peak"], transient_w=max(0, weight["peak"] - grads)))
        del hidden
    measured = {f"chunk{i}_{k}": v for i, s in enumerate(sizes) for k, v in vars(s).items()}
    measured.update({f"chunk{i}_push_peak": v[0] for i, v in pushes.items()})
    measured.update({f"chunk{i}_weight_grads": v[1] for i, v in pushes.items()})
    return sizes, message, measured


def _layers_resident(engine) -> int:
    """Bytes of the layer segments (--odc-param-residency layer) gathered now."""
    return sum(s.nbytes for u in engine.units for s in u.segments
               if s.module is not None and s.resident)


def _engine_bytes(engine, optimizer) -> dict[str, int]:
    """Bytes of the real engine's and optimizer's tensors (fake: nothing allocated)."""
    units = engine.units
    owned_params = [p for p in optimizer.master]
    # ddp (dp > 1): each shard is a slice of the replicated parameters, no memory of its own
    shard = 0 if engine.config.mode.is_ddp and not units[0].aliased else \
        _nbytes(u.param_shard for u in units)
    master = sum(m.numel() * 4 for m, u in zip(owned_params, units)
                 if m.dtype != u.param_shard.dtype)  # fp32 params: the shard is the master
    masks = _nbytes(m for m in optimizer.norm_mask)  # weight decay: pieces, no mask
    local = {"weight_grads": _nbytes(u.main_grad for u in units if not u.aliased)} \
        if engine.local_grads else {}
    return {**local, "params_gathered": sum(u.kept_nbytes for u in units),
            "params_sharded": shard,
            "grad_accumulators": _nbytes(u.grad_acc for u in units),
            "optimizer_state": master + _nbytes(optimizer.exp_avg) +
            _nbytes(optimizer.exp_avg_sq) + masks}


def _check(formula: dict[str, int], measured: dict[str, int], tolerance: float = 0.01):
    for name, value in measured.items():
        want = formula[name]
        if abs(want - value) > tolerance * max(value, 1) + 4096:
            raise AssertionError(f"memory formula of {name} gives {want} bytes but the "
                                 f"engine holds {value}: fix odc_pp.planner.memory")


def _advice(report: MemoryReport, job: Job, limit_peak) -> tuple[list[str], dict]:
    """(flags that bring ``report`` under its budget, cheapest first; the categories
    with them applied where the dry run can re-evaluate without measuring again: dropping
    the post-validation snapshot, the deterministic staging, and --memory-limit N, whose
    schedule is rebuilt and walked by ``limit_peak(N)`` -> per-microbatch categories or
    None). Empty and unchanged when it fits."""
    categories = dict(report.categories)
    over = report.total - report.memory_gb * GB
    advice: list[str] = []
    if over <= 0:
        return advice, categories
    for name, flag in (("odc_staging", "--nondeterministic-dp"),
                       ("post_validation_snapshot",
                        "drop --enable-optimizer-post-validation")):
        freed = categories.get(name, 0)
        if freed > 0:
            advice.append(f"{flag} (frees {freed / GB:.1f} GB)")
            categories[name] = 0
            over -= freed
            if over <= 0:
                return advice, categories
    args, fam = job.args, job.family
    if fam.memory_controlled and not fam.offloads:  # --memory-limit caps its activations
        timeline = sum(categories.get(k, 0) for k in _TIMELINE)
        current = args.schedule.memory_limit
        for limit in range(int(current or 4 * args.parallel.pipeline_model_parallel_size),
                           0, -1):
            limited = limit_peak(limit)
            if limited is not None and sum(limited.values()) - timeline + over <= 0:
                advice.append(f"--memory-limit {limit} (per-microbatch peak "
                              f"{sum(limited.values()) / GB:.1f} GB instead of "
                              f"{timeline / GB:.1f} GB)")
                categories.update(limited)
                return advice, categories
    timeline = sum(categories.get(k, 0) for k in _TIMELINE)
    if job.num_chunks == 1 and fam.name != "1f1b" \
            and categories.get("w_held", 0) > 0:
        other = limit_peak(None, "1f1b")  # W fused into B: no W-held tensors
        if other is not None and sum(other.values()) < timeline:
            advice.append(f"--pipeline-schedule 1f1b (no W-held tensors; per-microbatch "
                          f"peak {sum(other.values()) / GB:.1f} GB instead of "
                          f"{timeline / GB:.1f} GB, more pipeline bubble)")
            over += sum(other.values()) - timeline
            categories.update(other)
            if over <= 0:
                return advice, categories
    if not args.model.recompute_lgd:
        kept = {r: layer_bytes(args.model, vocab_size=args.model.vocab_size, tp=job.layout.tp,
                               sequence_parallel=args.parallel.sequence_parallel, recompute=r)
                for r in ("none", "lgd")}
        advice.append(f"--recompute-lgd (drops the norm/activation/dropout outputs: each "
                      f"layer keeps {kept['lgd']:.0f} instead of {kept['none']:.0f} bytes per "
                      f"token, odc_pp/planner/layer_activations.json; run the dry run again)")
    advice.append(f"or fewer tokens per microbatch (--max-tokens-per-microbatch / "
                  f"--micro-batch-size), a larger --pipeline-model-parallel-size or "
                  f"--tensor-model-parallel-size: {over / GB:.1f} GB over after the above")
    return advice, categories


_TIMELINE = ("sends", "receives", "activations", "w_held", "offload_device", "transient")


def _context_parallel_rank(job: Job) -> Job:
    """With --context-parallel-size N: the job one CP rank's memory equals -- a cp = 1
    rank holding 1/N of every row's tokens (activations / N), its state sharded over
    dp x N ranks (the world / (tp x pp) the topology then makes) and the replica's
    global batch / dp microbatches (the global batch scaled by N for dp x N replicas).
    The ring's in-flight K/V blocks (2 x tokens/N x kv width per layer, transient) are
    not counted."""
    args, cp = job.args, job.layout.cp
    if cp == 1:
        return job
    data = args.data
    tokens = data.max_tokens_per_microbatch
    folded = dataclasses.replace(
        args, parallel=dataclasses.replace(args.parallel, context_parallel_size=1),
        model=dataclasses.replace(args.model, seq_length=args.model.seq_length // cp),
        data=dataclasses.replace(data, global_batch_size=data.global_batch_size * cp,
                                 max_tokens_per_microbatch=tokens // cp if tokens else None))
    return dataclasses.replace(job, args=folded, layout=job.layout.folded_context())


def _cp1_rank(rank: int, layout: ParallelLayout) -> int:
    """The rank of the cp = 1 job (:func:`_context_parallel_rank`) at global ``rank``'s
    coordinates: the same tp and pipeline rank, data-parallel rank dp x cp + cp rank."""
    if layout.cp == 1:
        return rank
    tp_rank, cp_rank, pp_rank, dp_rank = layout.coordinates(rank)
    return layout_rank(dp_rank=dp_rank * layout.cp + cp_rank, pp_rank=pp_rank,
                       tp_rank=tp_rank, pp=layout.pp, tp=layout.tp)


def dry_run(job: Job, flags: DryRunFlags) -> MemoryReport:
    """The memory report of rank ``flags.rank`` of the resolved ``job`` (see module
    doc)."""
    if not job.args.model.vocab_size:
        raise ValueError("--dry-run needs --vocab-size (the model's padded vocabulary)")
    rank = _cp1_rank(flags.rank, job.layout)
    job = _context_parallel_rank(job)
    with _fake_world(rank, flags.world_size):
        return _dry_run_rank(job, flags, rank)


def _dry_run_rank(job: Job, flags: DryRunFlags, rank: int) -> MemoryReport:
    """:func:`dry_run` inside its fake world."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from odc_pp.schedule.build import build

    args = job.args
    topo = _topology(job, rank)
    m = replica_microbatches(args, topo.dp)
    schedule = build(job.schedule.with_microbatches(m), job_costs(job))
    pp_rank = topo.pp_rank
    residency = param_residency(job, budget_bytes=flags.memory_gb * GB)
    with FakeTensorMode(allow_non_fake_inputs=True), MemoryPhases() as tracker:
        chunks, engine, optimizer = _build(
            job, topo, args.model.vocab_size, residency,
            embedding_kept(job, residency, budget_bytes=flags.memory_gb * GB))
        held = _engine_bytes(engine, optimizer)
        built = tracker.now()
        microbatch = _microbatch(args, args.model.vocab_size)
        sizes, message, measured = _measure_chunks(tracker, chunks, engine, schedule,
                                                   pp_rank, microbatch)
        with tracker.phase() as snapshot:
            kept = optimizer.snapshot() if args.schedule.enable_optimizer_post_validation \
                else None
        del kept
    measured.update(held, post_validation_snapshot=snapshot["live"], message_bytes=message,
                    num_microbatches=m, tracked_after_build=built)
    units = UnitSizes(
        unit_params=tuple(u.numel for u in engine.units), dp=topo.dp,
        param_bytes=engine.units[0].param_shard.element_size(),
        deterministic=not args.parallel.nondeterministic_dp, local_grads=engine.local_grads,
        main_grad_bytes=torch.finfo(getattr(torch, engine.config.main_grad_dtype)).bits // 8,
        gathered_params=tuple(sum(s.numel for s in u.segments if s.module is None)
                              for u in engine.units)
        if engine.config.param_residency == "layer" else None,
        shard_params=tuple(u.shard_numel for u in engine.units),
        post_validation=args.schedule.enable_optimizer_post_validation,
        replicated=engine.config.mode.is_ddp,
        norm_mask=tuple(mask is not None for mask in optimizer.norm_mask))
    _check(state_bytes(units), {**held, "post_validation_snapshot": snapshot["live"]})
    report = _report(job, flags, schedule, pp_rank, units, sizes, message, measured)
    report.param_residency = engine.config.param_residency
    return report


def _report(job: Job, flags, schedule, pp_rank, units, sizes, message,
            measured) -> MemoryReport:
    from odc_pp.schedule.build import build

    from .schedules import training_request

    args, costs = job.args, job_costs(job)

    def timeline(schedule) -> dict[str, int]:
        return schedule_peak(schedule, pp_rank, sizes, message_bytes=message, costs=costs,
                             receives_preposted=flags.receives_preposted)

    def limit_peak(limit: int | None, name: str | None = None) -> dict[str, int] | None:
        """Per-microbatch categories with --memory-limit ``limit`` (or the schedule
        family ``name``): the same measured chunk sizes, another schedule."""
        limited = dataclasses.replace(
            args.schedule, memory_limit=None if limit is None else float(limit),
            pipeline_schedule=name or args.schedule.pipeline_schedule)
        try:
            other = build(training_request(
                limited, pp=schedule.pp, num_microbatches=schedule.num_microbatches,
                post_validation=args.schedule.enable_optimizer_post_validation), costs)
        except ValueError:
            return None
        return timeline(other)

    categories = dict(state_bytes(units), **timeline(schedule))
    report = MemoryReport(rank=flags.rank, categories=categories,
                          memory_gb=flags.memory_gb, measured=dict(measured))
    report.advice, report.advised = _advice(report, job, limit_peak)
    return report


def main(argv: list[str] | None = None) -> int:
    """``odc-pp memory`` / ``pretrain_gpt.py --dry-run``: print the report (and write it
    as JSON with --dry-run-json PATH); 0 when the job fits, 1 when not, 2 on bad flags."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        flags, rest = split_dry_run_flags(argv)
        job = parse_args(rest).resolve(flags.world_size, flags.world_size)
        report = dry_run(job, flags)
    except ValueError as exc:
        print(f"dry run: error: {exc}", file=sys.stderr)
        return 2
    print(report.format())
    if flags.json:
        with open(flags.json, "w") as handle:
            json.dump({REPORT_KEY: report.to_dict()}, handle, indent=1)
    return 0 if report.fits else 1
