"""Measure the activation bytes of one decoder layer of each kind with the FakeTensor dry
run's machinery and solve for its per-token coefficients: the producer of
``odc_pp/planner/layer_activations.json`` (:mod:`odc_pp.planner.layer_kinds`), run by
``tools/measure_layer_activations.py``.

One measurement (:func:`measure_layer`): ``pretrain_gpt.py``'s parser makes the job of
a 3-stage pipeline (on a fake world of 3 x tp ranks) whose stages hold one layer, and
again two; the middle stage's chunk is built as the dry run builds it (the GPU's attention and
loss kernels, fake tensors, ``MemTracker``), one microbatch runs F and then B with the
weight gradients deferred. The second layer's bytes are the difference of the two
chunks' saved (and W-held) bytes. The coefficients (:func:`measure_kind`) come from an
exact solve over as many shapes as unknowns, checked on one more shape.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from odc_pp.layout import layout_rank
from odc_pp.planner.layer_kinds import FEATURES, LayerKind

__all__ = ["LayerShape", "measure_layer", "measure_kind", "kind_flags", "SHAPES",
           "HEAD_DIM_SHAPE", "TP_SHAPES", "CHECK_SHAPE"]

_PP = 3


@dataclasses.dataclass(frozen=True, kw_only=True)
class LayerShape:
    """A small layer shape the kinds are measured at."""

    h: int
    """Hidden size."""
    heads: int
    """Attention heads."""
    groups: int
    """Query groups (GQA kinds; MHA: heads)."""
    seq: int
    """Sequence length."""
    ffn: int
    """MLP width."""

    def features(self, gqa: bool) -> dict[str, float]:
        kv = self.h // self.heads * (self.groups if gqa else self.heads)
        return {"h": self.h, "ffn": self.ffn, "kv": kv, "heads": self.heads,
                "seq_heads": self.seq * self.heads, "one": 1, "head_dim": self.h // self.heads}


SHAPES = (LayerShape(h=256, heads=4, groups=2, seq=64, ffn=512),
          LayerShape(h=512, heads=4, groups=2, seq=64, ffn=512),
          LayerShape(h=256, heads=4, groups=2, seq=64, ffn=1024),
          LayerShape(h=256, heads=4, groups=2, seq=128, ffn=512),
          LayerShape(h=256, heads=8, groups=4, seq=64, ffn=512),
          LayerShape(h=512, heads=8, groups=4, seq=64, ffn=512),
          LayerShape(h=256, heads=8, groups=2, seq=64, ffn=512))
"""The shapes solved over: each moves one feature (the sixth: the head dimension apart
from h and the heads, RoPE kinds only; the last: the key/value width, GQA kinds only).
Every GQA shape has two heads per group or more (the unfused attention repeats keys
and values only then) and two groups or more: with one group per tensor-parallel rank
(multi-query, or as many groups as tp) the query is a view of the qkv projection's
output, not a copy: such a layer without RoPE keeps ``2 h / tp`` bytes per token fewer
than its kind's row (``odc_pp.planner.memory.saved_bytes_per_token`` subtracts them)."""
HEAD_DIM_SHAPE = SHAPES[5]
"""The shape that moves the head dimension (RoPE kinds only)."""
TP_SHAPES = (LayerShape(h=256, heads=8, groups=4, seq=64, ffn=512),
             LayerShape(h=512, heads=8, groups=4, seq=64, ffn=512),
             LayerShape(h=512, heads=16, groups=8, seq=64, ffn=512))
"""The shapes measured at tp = 2: two query groups per rank (with one, the query is a
view of the qkv projection's output, not a copy); the third moves the head dimension
(RoPE kinds only)."""
CHECK_SHAPE = LayerShape(h=384, heads=6, groups=3, seq=96, ffn=768)
"""The shape the solution is checked on (every feature moved)."""


def kind_flags(kind: LayerKind, shape: LayerShape) -> list[str]:
    """``pretrain_gpt.py`` model flags of ``kind`` at ``shape`` (bf16, biases)."""
    flags = ["--hidden-size", str(shape.h), "--num-attention-heads", str(shape.heads),
             "--ffn-hidden-size", str(shape.ffn), "--seq-length", str(shape.seq),
             "--max-position-embeddings", str(shape.seq), "--normalization",
             kind.normalization, "--position-embedding-type", kind.position,
             "--attention-backend", "sdpa" if kind.flash else "host",
             "--hidden-dropout", "0.1" if kind.hidden_dropout else "0",
             "--attention-dropout", "0.1" if kind.hidden_dropout and not kind.flash else "0",
             "--bf16", "--vocab-size", "128", "--mock-data"]
    if kind.mlp == "swiglu":
        flags.append("--swiglu")
    if kind.attention == "gqa":
        flags += ["--group-query-attention", "--num-query-groups", str(shape.groups)]
    if kind.recompute == "lgd":
        flags.append("--recompute-lgd")
    elif kind.recompute == "full":
        flags += ["--recompute-full", "--recompute-method", "uniform",
                  "--recompute-num-layers", "1"]
    return flags


def _chunk_bytes(flags: list[str], layers: int, tp: int, sp: bool) -> tuple[int, int]:
    """(saved, W-held) bytes of the middle stage's chunk of ``layers`` layers."""
    import torch.distributed as dist

    from .arguments import parse_args
    from .dry_run import _fake_world

    world = _PP * tp
    args = parse_args(flags + [
        "--num-layers", str(_PP * layers), "--pipeline-model-parallel-size", str(_PP),
        "--tensor-model-parallel-size", str(tp), "--global-batch-size", str(_PP),
        "--micro-batch-size", "1"] + (["--sequence-parallel"] if sp else []))
    job = args.resolve(world, world)
    rank = layout_rank(dp_rank=0, pp_rank=1, tp_rank=0, pp=_PP, tp=tp)
    if dist.is_initialized() and (dist.get_rank(), dist.get_world_size()) != (rank, world):
        dist.destroy_process_group()  # the fake world of another tp
    with _fake_world(rank, world):
        return _measured(args, job, rank)


def _measured(args, job, rank: int) -> tuple[float, float]:
    """:func:`_chunk_bytes` inside its fake world."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from odc_pp.runtime.wgrad import WeightGradQueue

    from .components import build_model
    from .dry_run import MemoryPhases, _fake_module_to, _microbatch, gpu_model
    from .distributed import Topology

    topo = Topology.for_job(job, rank, torch.device("cpu"))
    with FakeTensorMode(allow_non_fake_inputs=True), MemoryPhases() as tracker:
        with _fake_module_to():
            chunk, = build_model(gpu_model(args.model), args.schedule, args.parallel, topo,
                                 placement=job.placement, vocab_size=128, seed=0,
                                 load_weights=False)
        queue = WeightGradQueue()
        queue.attach(0, chunk)
        microbatch = _microbatch(args, 128)
        shape, dtype = chunk.input_shape(microbatch)
        hidden = torch.empty(shape, dtype=dtype).requires_grad_()
        with tracker.phase() as forward:
            output = chunk(hidden, microbatch)
        with queue.deferring(0, 0):
            torch.autograd.backward(output, grad_tensors=torch.empty_like(output))
        return forward["live"], queue.pending_bytes(0, 0)


def measure_layer(kind: LayerKind, shape: LayerShape, *, tp: int = 1,
                  sequence_parallel: bool = False) -> tuple[float, float]:
    """(saved, W-held) bytes per token of one layer of ``kind`` at ``shape`` on one
    tensor-parallel rank (tokens: the microbatch's, ``shape.seq``)."""
    import torch.distributed as dist

    flags = kind_flags(kind, shape)
    owned = not dist.is_initialized()  # the fake world made here is destroyed here
    try:
        one = _chunk_bytes(flags, 1, tp, sequence_parallel)
        two = _chunk_bytes(flags, 2, tp, sequence_parallel)
    finally:
        if owned and dist.is_initialized():
            dist.destroy_process_group()
    return ((two[0] - one[0]) / shape.seq, (two[1] - one[1]) / shape.seq)


def _solve(rows: list[dict[str, float]], values: list[float],
           names: list[str]) -> dict[str, float]:
    matrix = np.array([[row[n] for n in names] for row in rows], dtype=float)
    solution = np.linalg.solve(matrix, np.array(values, dtype=float))
    return {n: float(round(c, 4)) for n, c in zip(names, solution)}


def _predict(coefficients: dict[str, float], features: dict[str, float]) -> float:
    return sum(c * features[n] for n, c in coefficients.items())


def measure_kind(kind: LayerKind) -> dict:
    """The table entry of ``kind``: per quantity (saved, w_held) the tp = 1 coefficients
    over :data:`~odc_pp.planner.layer_kinds.FEATURES`, the parts not split at tp = 2
    (with and without sequence parallelism) as ``h`` and ``one`` terms, and the check
    shape's relative error of the solution."""
    gqa = kind.attention == "gqa"
    names = [n for n in FEATURES if (gqa or n != "kv") and
             (kind.position == "rope" or n != "head_dim")]
    # the head dimension enters through RoPE's tables only
    shapes = [s for s in SHAPES if kind.position == "rope" or s is not HEAD_DIM_SHAPE]
    shapes = shapes if gqa else shapes[:-1]
    rows = [s.features(gqa) for s in shapes]
    measured = [measure_layer(kind, s) for s in shapes]
    check = measure_layer(kind, CHECK_SHAPE)
    entry = {}
    for q, quantity in enumerate(("saved", "w_held")):
        total = _solve(rows, [m[q] for m in measured], names)
        want = check[q]
        error = abs(_predict(total, CHECK_SHAPE.features(gqa)) - want) / max(want, 1.0)
        entry[quantity] = {"total": total, "max_error": round(error, 6)}
    # the parts not split at tp = 2 (with and without sequence parallelism): h, head
    # dimension (RoPE's tables) and constant terms, from the shapes that move them, each
    # against the tp = 1 solution (exact) at that shape
    tp_shapes = TP_SHAPES if kind.position == "rope" else TP_SHAPES[:2]
    tp_names = ["h", "one"] + (["head_dim"] if kind.position == "rope" else [])
    for key, sp in (("replicated_sp", True), ("replicated", False)):
        at_tp2 = [measure_layer(kind, s, tp=2, sequence_parallel=sp) for s in tp_shapes]
        for q, quantity in enumerate(("saved", "w_held")):
            total = entry[quantity]["total"]
            kept = [2 * two[q] - _predict(total, s.features(gqa))
                    for two, s in zip(at_tp2, tp_shapes)]
            entry[quantity][key] = _solve([s.features(gqa) for s in tp_shapes], kept,
                                          tp_names)
    return entry
