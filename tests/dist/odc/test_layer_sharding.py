"""``--odc-param-residency layer`` shards every layer over all dp ranks (issue 50, item 4):
2 CPU ranks over the shared-memory transport, a unit of a kept stem, layers gathered per
use (odd sizes: a layer's shard ends in padding) and a kept head, driven as the pipeline
runtime drives a chunk.

* Every rank owns about half of every layer (``ceil`` or ``floor`` of ``n / dp``), where
  the contiguous cut of minibatch residency leaves whole layers to one rank.
* Every per-layer gather reads from the other rank (``get_many`` names every other rank).
* Losses and parameters after several steps are bitwise those of minibatch residency
  (elementwise AdamW; the padding stays zero), and the model statistics' masks count
  exactly the owned parameter elements. Over a group that adds pushes as they arrive
  (each microbatch's gradient pushed per layer into the owners' accumulator views): the
  same training to rounding.
* A checkpoint saved under layer residency resumes under minibatch residency (and the
  other way round) by parameter name: the same parameters, and one more step on each
  gives bitwise the same parameters as the run that went on without the checkpoint."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from odc_pp.testing.launch import LaunchConfig, run_workers

pytestmark = pytest.mark.multiproc

HIDDEN, FFN, TOKENS, LAYERS, VOCAB = 5, 7, 16, 6, 11
STEPS, MICROBATCHES = 3, 2
FUSED = False
"""The ``foreach`` AdamW kernel: torch's fused CPU kernel rounds a call's short tail (a
partial vector, scalar code) differently from its vectorised body, so its result for an
element moves by an ulp with where the shard cut puts it (any cut: another dp size too).
The foreach kernel is elementwise whatever the cut, so the layouts must agree bitwise."""


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(HIDDEN, FFN)
        self.down = nn.Linear(FFN, HIDDEN, bias=False)  # 42 + 35 = 77: odd

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(x)))


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(HIDDEN, HIDDEN)
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, x):
        x = self.stem(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _build(residency: str, deterministic: bool = True):
    from odc_pp.odc import primitives as prim
    from odc_pp.odc.engine import OdcConfig, ShardedDataParallel
    from odc_pp.odc.sharded_optimizer import AdamWConfig, ShardedAdamW

    torch.manual_seed(0)
    model = Model()
    group = prim.new_group(config=prim.TransportConfig(deterministic=deterministic,
                                                             timeout_s=60))
    engine = ShardedDataParallel(
        [model], OdcConfig(mode="odc", unit_driver="pipeline", param_residency=residency),
        group, layers=[list(model.layers)])
    no_decay = lambda name, shape: name.endswith("bias")  # noqa: E731 (a mask by name)
    optimizer = ShardedAdamW(engine, AdamWConfig(lr=1e-2, weight_decay=0.1, no_decay=no_decay,
                                                 fused=FUSED), norm_group=None)
    return model, group, engine, optimizer


def _steps(model, engine, optimizer, rank: int, steps: range) -> list[float]:
    losses = []
    for step in steps:
        engine.begin_minibatch()
        for microbatch in range(MICROBATCHES):
            generator = torch.Generator().manual_seed(100 * step + 10 * microbatch + rank)
            inputs = torch.randn(TOKENS, HIDDEN, generator=generator)
            labels = torch.randint(0, VOCAB, (TOKENS,), generator=generator)
            engine.before_forward(0, microbatch)
            loss = nn.functional.cross_entropy(model(inputs), labels, reduction="sum")
            engine.before_backward(0, microbatch)
            (loss / (TOKENS * MICROBATCHES * 2)).backward()
            engine.after_weight_grad(0, microbatch)
            losses.append(loss.item())
        engine.finish_minibatch()
        optimizer.clip_and_step(None)
    return losses


def _layer_spans(engine) -> list[tuple[int, int]]:
    """Flat range of each layer (``layers.<i>.*``: contiguous in the flat order)."""
    (layout,) = engine.layout()
    spans = []
    for index in range(LAYERS):
        ends = [(offset, offset + torch.Size(shape).numel())
                for name, shape, offset in zip(layout.names, layout.shapes, layout.offsets)
                if name.startswith(f"layers.{index}.")]
        spans.append((min(lo for lo, _ in ends), max(hi for _, hi in ends)))
    return spans


def _ownership(engine) -> list[int]:
    """Elements of each layer this rank owns."""
    (layout,) = engine.layout()
    return [sum(max(0, min(hi, b) - max(lo, a)) for lo, hi, _ in layout.owned)
            for a, b in _layer_spans(engine)]


def _padding_zero_and_counted(engine, optimizer) -> bool:
    from odc_pp.training.model_stats import counted_masks

    (unit,) = engine.units
    (mask,) = counted_masks(optimizer)
    owned = sum(hi - lo for lo, hi, _ in unit.owned)
    counted = unit.owned_numel if mask is None else int(mask.sum())
    padding = torch.ones(unit.shard_numel, dtype=torch.bool)
    for lo, hi, at in unit.owned:
        padding[at:at + hi - lo] = False
    return counted == owned and bool((unit.param_shard[padding] == 0).all()) \
        and bool((optimizer.master[0][padding[:unit.owned_numel]] == 0).all())


def _run(rank: int, residency: str, root: str) -> dict:
    from odc_pp.training.checkpoint.checkpointing import save_checkpoint, checkpoint_dir
    from odc_pp.training.checkpoint.resharding import sharded_state

    model, group, engine, optimizer = _build(residency)
    peers = []
    get_many = group.get_many

    def recording(pieces, **kwargs):
        peers.append(sorted({peer for _, _, peer in pieces}))
        return get_many(pieces, **kwargs)
    group.get_many = recording
    losses = _steps(model, engine, optimizer, rank, range(STEPS))
    save_checkpoint(os.path.join(root, residency), STEPS, sharded_state(engine, optimizer),
                    rank=rank, world_size=2, barrier=torch.distributed.barrier)
    saved = {k: v.numpy().copy() for k, v in engine.full_state_dict().items()}
    losses += _steps(model, engine, optimizer, rank, range(STEPS, STEPS + 1))
    result = {"losses": losses, "saved": saved, "owned": _ownership(engine),
              "layer_numel": [hi - lo for lo, hi in _layer_spans(engine)],
              "peers": peers, "clean": _padding_zero_and_counted(engine, optimizer),
              "params": {k: v.numpy().copy() for k, v in engine.full_state_dict().items()},
              "directory": checkpoint_dir(os.path.join(root, residency), STEPS)}
    group.get_many = get_many
    engine.destroy()
    group.destroy()
    return result


def _resume(rank: int, residency: str, directory: str) -> dict:
    from odc_pp.training.checkpoint.resharding import restore_optimizer

    model, group, engine, optimizer = _build(residency)
    step = restore_optimizer(directory, engine, optimizer, rank=rank)
    restored = {k: v.numpy().copy() for k, v in engine.full_state_dict().items()}
    _steps(model, engine, optimizer, rank, range(STEPS, STEPS + 1))
    result = {"step": step, "restored": restored, "clean": _padding_zero_and_counted(
        engine, optimizer), "params": {k: v.numpy().copy()
                                       for k, v in engine.full_state_dict().items()}}
    engine.destroy()
    group.destroy()
    return result


def _added_up(rank: int) -> dict:
    """Layer residency over a group that adds each push into the owners as it arrives
    (every microbatch's gradient pushed, per layer, into accumulator views)."""
    model, group, engine, optimizer = _build("layer", deterministic=False)
    assert not engine.local_grads
    losses = _steps(model, engine, optimizer, rank, range(STEPS + 1))
    params = {k: v.numpy().copy() for k, v in engine.full_state_dict().items()}
    engine.destroy()
    group.destroy()
    return {"losses": losses, "params": params}


def _worker(rank, world, root):
    runs = {residency: _run(rank, residency, root) for residency in ("layer", "minibatch")}
    runs["added"] = _added_up(rank)
    resumed = {"minibatch": _resume(rank, "minibatch", runs["layer"]["directory"]),
               "layer": _resume(rank, "layer", runs["minibatch"]["directory"])}
    return runs, resumed


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


def test_layer_residency_shards_every_layer_over_all_ranks(tmp_path):
    results = run_workers(_worker, 2, str(tmp_path), config=LaunchConfig(timeout_s=300))
    for rank, (runs, resumed) in enumerate(results):
        layer, whole = runs["layer"], runs["minibatch"]
        sizes = layer["layer_numel"]
        assert len(sizes) == LAYERS and all(n % 2 == 1 for n in sizes)
        # every layer: about half on each rank (the contiguous cut gives whole layers)
        assert all(owned in (n // 2, -(-n // 2)) for owned, n in zip(layer["owned"], sizes))
        assert any(owned in (0, n) for owned, n in zip(whole["owned"], sizes))
        # every gather (layers F and B, kept stem and head) reads from the other rank
        assert layer["peers"] and all(p == [1 - rank] for p in layer["peers"])
        assert layer["clean"] and whole["clean"]
        # the same numbers as minibatch residency
        assert layer["losses"] == whole["losses"]
        assert _equal(layer["saved"], whole["saved"])
        assert _equal(layer["params"], whole["params"])
        # checkpoints resharded by name across the two layouts: identical parameters, and
        # the step after the resume equals the uninterrupted run's
        for residency, run in resumed.items():
            assert run["step"] == STEPS and run["clean"]
            assert _equal(run["restored"], layer["saved"])
            assert _equal(run["params"], layer["params"])
        # pushes added up as they arrive: the same training to rounding
        added = runs["added"]
        assert added["losses"] == pytest.approx(whole["losses"], rel=1e-5)
        assert all(added["params"][k] == pytest.approx(v, rel=1e-4, abs=1e-6)
                   for k, v in whole["params"].items())
    assert results[0][0]["layer"]["losses"] != results[1][0]["layer"]["losses"]
