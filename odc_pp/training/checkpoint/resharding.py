"""Resume a checkpoint saved with another parallel layout (pipeline size, data-parallel
size or mode, schedule, model chunks).

Each rank's checkpoint file carries, beside its optimizer shard, the layout of its units
(:func:`unit_layout`): per parameter its global name (decoder layer indices made global,
see :mod:`odc_pp.megatron.model`), offset and size in the unit's flat buffer, and the
range of that buffer the rank owned (``start``/``end``; layer residency: its ``owned``
pieces, :mod:`odc_pp.odc.shard_map`). Under another layout every rank reads all files of
the checkpoint, assembles each parameter's fp32 master weights and AdamW moments by
global name (:func:`assemble_by_name`) and cuts out the ranges it owns now
(:func:`owned_state`). The result is the same model and optimizer state, so training goes
on from the same point; losses then match an uninterrupted run to rounding (summation
order changes with the layout), not bit for bit. RNG states are per rank and do not carry
over; dropout does not need them (its masks are keyed by the data,
:mod:`odc_pp.megatron.dropout`), so its masks after a resharded resume are the
uninterrupted run's.

Tensor parallelism. A tp rank's units hold shards; its layout records the tp rank and
size and, per parameter, how it is split (:mod:`odc_pp.megatron.tp_layout`, the one
table). :func:`assemble_by_name` puts the shards of a split parameter back together (the
AdamW moments are elementwise, so they split like the parameter) and takes a replicated
parameter from any tp rank; :func:`owned_state` cuts the shard of the tp rank loading.
So a checkpoint saved at one tp size resumes at another. Layouts without tp entries
(written before tensor parallelism) read as tp = 1.

Tied embeddings. A tied model holds one weight where the embedding and the output layer
share a stage (pp = 1) and two equal copies across stages (the last stage's output layer,
:data:`~odc_pp.megatron.model.OUTPUT_WEIGHT`); a checkpoint saved without the copy gives
it the embedding's state (:func:`owned_state`), one saved with it drops it where the
model has none, so the tie is kept across pipeline sizes. (An untied model's checkpoint
always holds its output layer; the model-identity check refuses a tie that differs.)

Every rank holds the whole model's fp32 state (three copies) in host memory while loading.
"""

from __future__ import annotations

import torch

from ...odc.shard_map import owned_numel, param_pieces
from ...megatron.model import EMBEDDING_WEIGHT, OUTPUT_WEIGHT
from ...megatron.tp_layout import Partition, partition_of
from .checkpointing import load_rank_state, rank_file, read_meta
from .resume_iteration import check_rank_iteration

__all__ = ["STATE_NAMES", "unit_layout", "assemble_by_name", "owned_state",
           "read_optimizer_state", "restore_optimizer", "sharded_state"]

STATE_NAMES = ("master", "exp_avg", "exp_avg_sq")


def unit_layout(engine) -> list[dict]:
    """Per unit of ``engine`` (:meth:`ShardedDataParallel.layout`): global parameter names,
    offsets, sizes, shapes and this rank's owned range [start, end) of the flat buffer.
    Units with ``global_named_parameters()`` (GPT chunks) give layout-independent names;
    other modules are named ``<unit index>.<parameter name>``."""
    layout = []
    for unit in engine.layout():
        if hasattr(unit.module, "global_named_parameters"):
            local_to_global = {local: canonical for (local, _), (canonical, _) in zip(
                unit.module.named_parameters(), unit.module.global_named_parameters())}
        else:
            local_to_global = {name: f"{unit.index}.{name}" for name in unit.names}
        names = [local_to_global[name] for name in unit.names]
        entry = {"names": names, "offsets": list(unit.offsets),
                 "numels": [int(torch.Size(shape).numel()) for shape in unit.shapes],
                 "shapes": [list(shape) for shape in unit.shapes],
                 **_owned_entry(unit.owned)}
        tp = getattr(unit.module, "tensor_parallel", None)
        if tp is not None and tp.size > 1:
            gated = bool(getattr(unit.module, "gated_mlp", False))
            entry["tp"] = [tp.rank, tp.size]
            entry["splits"] = [_split_of(partition_of(name, gated_mlp=gated))
                               for name in names]
        layout.append(entry)
    return layout


def _owned_entry(owned) -> dict:
    """How a rank file records the owned pieces: ``start``/``end`` for one contiguous
    range at shard position 0 (and for none), else ``owned`` ``[flat_lo, flat_hi,
    shard_lo]`` pieces (layer residency, :mod:`odc_pp.odc.shard_map`)."""
    if not owned:
        return {"start": 0, "end": 0}
    if len(owned) == 1 and owned[0][2] == 0:
        return {"start": owned[0][0], "end": owned[0][1]}
    return {"owned": [list(piece) for piece in owned]}


def _owned_pieces(unit: dict) -> list:
    """A saved or current unit layout's owned ``(flat_lo, flat_hi, shard_lo)`` pieces."""
    if "owned" in unit:
        return [tuple(piece) for piece in unit["owned"]]
    return [(unit["start"], unit["end"], 0)] if unit["end"] > unit["start"] else []


def _split_of(partition: Partition) -> list | None:
    return None if partition.replicated else [partition.dim, partition.gated]


def _partition(split: list | None) -> Partition:
    return Partition(None) if split is None else Partition(split[0], gated=bool(split[1]))


def _unit_tp(unit: dict) -> tuple[int, int, list]:
    """(tp rank, tp size, split per parameter) of a saved or current unit layout."""
    rank, size = unit.get("tp", (0, 1))
    return rank, size, unit.get("splits") or [None] * len(unit["names"])


def assemble_by_name(directory: str, saved_world_size: int, *, iteration: int | None = None
                     ) -> tuple[int, dict[str, dict]]:
    """(optimizer step, {global name: {"shape", "master", "exp_avg", "exp_avg_sq"}}) from
    every rank file of a checkpoint directory (each verified, see
    :func:`~.checkpointing.load_rank_state`). Raises ValueError if a file has no layout
    (saved before layouts were recorded), records another iteration than ``iteration``
    (:func:`~.resume_iteration.check_rank_iteration`) or an element is covered by no file."""
    step, tensors, filled = None, {}, {}
    for rank in range(saved_world_size):
        state = load_rank_state(directory, rank)
        check_rank_iteration(state, rank_file(directory, rank), iteration)
        if "layout" not in state:
            raise ValueError(f"{rank_file(directory, rank)} records no parameter layout, so "
                             f"it cannot be resumed under another parallel layout; resume "
                             f"with the layout it was saved with")
        optimizer = state["optimizer"]
        step = int(optimizer["step"]) if step is None else step
        for index, unit in enumerate(state["layout"]):
            pieces = {name: optimizer[name][index] for name in STATE_NAMES}
            _scatter_unit(unit, pieces, tensors, filled)
    missing = [name for name, mask in filled.items() if not bool(mask.all())]
    if missing:
        raise ValueError(f"checkpoint {directory} lacks parts of {missing[:3]} "
                         f"({len(missing)} parameters): a rank file is incomplete")
    return step or 0, _unshard(tensors, directory)


def _scatter_unit(unit: dict, pieces: dict, tensors: dict, filled: dict) -> None:
    """Copy a rank's owned range of one unit into the per-name flat tensors (a split
    parameter's shards under ``(name, tp rank)``)."""
    owned = _owned_pieces(unit)
    tp_rank, tp_size, splits = _unit_tp(unit)
    for name, offset, numel, shape, split in zip(unit["names"], unit["offsets"],
                                                 unit["numels"], unit["shapes"], splits):
        for low, high, at in param_pieces(owned, offset, numel):
            key_name = name if split is None else (name, tp_rank)
            if key_name not in tensors:
                tensors[key_name] = {"shape": list(shape), "split": split, "tp_size": tp_size,
                                     **{key: torch.zeros(numel) for key in STATE_NAMES}}
                filled[key_name] = torch.zeros(numel, dtype=torch.bool)
            for key in STATE_NAMES:
                tensors[key_name][key][low:high] = pieces[key][at:at + high - low]
            filled[key_name][low:high] = True


def _unshard(tensors: dict, directory: str) -> dict[str, dict]:
    """Full tensors by name: the tp shards ``(name, rank)`` of a split parameter put back
    together in rank order (:class:`~odc_pp.megatron.tp_layout.Partition`)."""
    full = {name: entry for name, entry in tensors.items() if isinstance(name, str)}
    for name in sorted({key[0] for key in tensors if isinstance(key, tuple)}):
        first = tensors[(name, 0)] if (name, 0) in tensors else None
        size = (first or next(e for k, e in tensors.items()
                              if isinstance(k, tuple) and k[0] == name))["tp_size"]
        shards = [tensors.get((name, rank)) for rank in range(size)]
        if any(shard is None for shard in shards):
            raise ValueError(f"checkpoint {directory} lacks tensor-parallel shards of "
                             f"{name!r}: a rank file is missing")
        partition = _partition(shards[0]["split"])
        shape = list(partition.full_shape(shards[0]["shape"], size))
        full[name] = {"shape": shape, **{key: partition.unshard(
            [shard[key].view(shard["shape"]) for shard in shards]).reshape(-1)
            for key in STATE_NAMES}}
    for entry in full.values():
        entry.pop("split", None)
        entry.pop("tp_size", None)
    return full


def owned_state(tensors: dict[str, dict], step: int, layout: list[dict],
                device: torch.device | str = "cpu") -> dict:
    """This rank's optimizer state (``ShardedAdamW.state_dict`` format, on ``device``) cut
    out of the assembled tensors for ``layout`` (:func:`unit_layout`). Raises ValueError
    naming a parameter the checkpoint lacks or holds with another shape (another model)."""
    state = {"step": step, **{key: [] for key in STATE_NAMES}}
    for unit in layout:
        mine = _owned_pieces(unit)
        owned = {key: torch.zeros(owned_numel(mine)) for key in STATE_NAMES}
        tp_rank, tp_size, splits = _unit_tp(unit)
        for name, offset, numel, shape, split in zip(unit["names"], unit["offsets"],
                                                     unit["numels"], unit["shapes"], splits):
            partition = _partition(split)
            full_shape = list(partition.full_shape(shape, tp_size))
            saved = _saved_entry(tensors, name)
            if saved is None or saved["shape"] != full_shape:
                found = "missing" if saved is None else f"shape {saved['shape']}"
                raise ValueError(f"checkpoint holds a different model: parameter {name!r} "
                                 f"is {found}, the model needs shape {full_shape}: resume "
                                 f"with the model flags it was saved with")
            for low, high, at in param_pieces(mine, offset, numel):
                for key in STATE_NAMES:
                    local = partition.shard(saved[key].view(full_shape), tp_rank,
                                            tp_size).reshape(-1)
                    owned[key][at:at + high - low] = local[low:high]
        for key in STATE_NAMES:
            state[key].append(owned[key])
    for key in STATE_NAMES:
        state[key] = [tensor.to(device) for tensor in state[key]]
    return state


def _saved_entry(tensors: dict[str, dict], name: str) -> dict | None:
    """The assembled entry of ``name``; for a tied output layer that the checkpoint holds
    no copy of (saved where it shares the embedding's stage), the embedding's."""
    if name == OUTPUT_WEIGHT and name not in tensors:
        return tensors.get(EMBEDDING_WEIGHT)
    return tensors.get(name)


def read_optimizer_state(directory: str, engine, *, rank: int, saved_world_size: int,
                         exact: bool, iteration: int | None = None
                         ) -> tuple[dict, dict | None]:
    """(state for ``ShardedAdamW.load_state_dict`` on the engine's device, this rank's saved
    file or None). ``exact``: the checkpoint was saved under this parallel layout, so rank
    ``rank``'s own file is used as it is (bit-exact resume) when the units' layout it
    records equals ``engine``'s; otherwise (and without ``exact``) every file is read and
    the state is resharded by parameter name (the saved file is then None). Reads files
    only: nothing is applied, no peer is waited for (the caller applies the state and
    calls ``engine.finish_step()``). ``iteration``: every file read must record it (when
    it records one)."""
    layout = unit_layout(engine)
    device = engine.owned_params()[0].device
    if exact:
        saved = load_rank_state(directory, rank)
        check_rank_iteration(saved, rank_file(directory, rank), iteration)
        if saved.get("layout") == layout:
            state = dict(saved["optimizer"])
            for key in STATE_NAMES:
                state[key] = [tensor.to(device) for tensor in state[key]]
            return state, saved
    step, tensors = assemble_by_name(directory, saved_world_size, iteration=iteration)
    return owned_state(tensors, step, layout, device), None


def restore_optimizer(directory: str, engine, optimizer, *, rank: int) -> int:
    """Load a checkpoint directory (saved with :func:`sharded_state` as the rank files'
    state) into ``optimizer`` and publish the shards (collective over the engine's group:
    ``finish_step``). ``rank``: this rank's index among the ranks that saved, when the
    data-parallel size is the saved one (exact, bit for bit); at another size the state is
    resharded by parameter name. Returns the optimizer step."""
    saved_world_size = int(read_meta(directory)["world_size"])
    exact = saved_world_size == engine.group.world_size
    state, _ = read_optimizer_state(directory, engine, rank=rank,
                                    saved_world_size=saved_world_size, exact=exact)
    optimizer.load_state_dict(state)
    engine.finish_step()
    return int(state["step"])


def sharded_state(engine, optimizer) -> dict:
    """What a rank file holds for ``engine`` + ``optimizer``: the optimizer's owned state
    and the units' layout (read back by :func:`read_optimizer_state`)."""
    return {"optimizer": optimizer.state_dict(), "layout": unit_layout(engine)}
