"""Resume a checkpoint saved with another parallel layout (pipeline size, data-parallel
size or mode, schedule, model chunks).

Each rank's checkpoint file carries, beside its optimizer shard, the layout of its units
(:func:`unit_layout`): per parameter its global name (decoder layer indices made global,
see :mod:`odc_pp.megatron.model`), offset and size in the unit's flat buffer, and the
range of that buffer the rank owned. Under another layout every rank reads all files of
the checkpoint, assembles each parameter's fp32 master weights and AdamW moments by
global name (:func:`assemble_by_name`) and cuts out the ranges it owns now
(:func:`owned_state`). The result is the same model and optimizer state, so training goes
on from the same point; losses then match an uninterrupted run to rounding (summation
order changes with the layout), not bit for bit. RNG states are per rank and do not carry
over: dropout masks after a resharded resume differ from an uninterrupted run.

Every rank holds the whole model's fp32 state (three copies) in host memory while loading.
"""

from __future__ import annotations

import os

import torch

__all__ = ["STATE_NAMES", "unit_layout", "assemble_by_name", "owned_state"]

STATE_NAMES = ("master", "exp_avg", "exp_avg_sq")


def unit_layout(engine) -> list[dict]:
    """Per unit of ``engine`` (GPT chunks): global parameter names, offsets, sizes, shapes
    and this rank's owned range [start, end) of the flat buffer."""
    layout = []
    for unit in engine.units:
        local_to_global = {local: canonical for (local, _), (canonical, _) in zip(
            unit.module.named_parameters(), unit.module.global_named_parameters())}
        layout.append({"names": [local_to_global[name] for name in unit.names],
                       "offsets": list(unit.offsets),
                       "numels": [int(torch.Size(shape).numel()) for shape in unit.shapes],
                       "shapes": [list(shape) for shape in unit.shapes],
                       "start": unit.start, "end": unit.end})
    return layout


def assemble_by_name(directory: str, saved_world_size: int) -> tuple[int, dict[str, dict]]:
    """(optimizer step, {global name: {"shape", "master", "exp_avg", "exp_avg_sq"}}) from
    every rank file of a checkpoint directory. Raises ValueError if a file has no layout
    (saved before layouts were recorded) or an element is covered by no file."""
    step, tensors, filled = None, {}, {}
    for rank in range(saved_world_size):
        path = os.path.join(directory, f"rank_{rank:05d}.pt")
        state = torch.load(path, map_location="cpu", weights_only=False)
        if "layout" not in state:
            raise ValueError(f"{path} records no parameter layout, so it cannot be resumed "
                             f"under another parallel layout; resume with the layout it was "
                             f"saved with")
        optimizer = state["optimizer"]
        step = int(optimizer["step"]) if step is None else step
        for index, unit in enumerate(state["layout"]):
            pieces = {name: optimizer[name][index] for name in STATE_NAMES}
            _scatter_unit(unit, pieces, tensors, filled)
    missing = [name for name, mask in filled.items() if not bool(mask.all())]
    if missing:
        raise ValueError(f"checkpoint {directory} lacks parts of {missing[:3]} "
                         f"({len(missing)} parameters): a rank file is incomplete")
    return step or 0, tensors


def _scatter_unit(unit: dict, pieces: dict, tensors: dict, filled: dict) -> None:
    """Copy a rank's owned range of one unit into the per-name flat tensors."""
    start, end = unit["start"], unit["end"]
    for name, offset, numel, shape in zip(unit["names"], unit["offsets"], unit["numels"],
                                          unit["shapes"]):
        low, high = max(start, offset), min(end, offset + numel)
        if high <= low:
            continue
        if name not in tensors:
            tensors[name] = {"shape": list(shape),
                             **{key: torch.zeros(numel) for key in STATE_NAMES}}
            filled[name] = torch.zeros(numel, dtype=torch.bool)
        for key in STATE_NAMES:
            tensors[name][key][low - offset:high - offset] = pieces[key][low - start:high - start]
        filled[name][low - offset:high - offset] = True


def owned_state(tensors: dict[str, dict], step: int, engine, layout: list[dict]) -> dict:
    """This rank's optimizer state (``ShardedAdamW.state_dict`` format) cut out of the
    assembled tensors. Raises ValueError naming a parameter the checkpoint lacks or holds
    with another shape (another model)."""
    state = {"step": step, **{key: [] for key in STATE_NAMES}}
    for unit in layout:
        size = unit["end"] - unit["start"]
        owned = {key: torch.zeros(size) for key in STATE_NAMES}
        for name, offset, numel, shape in zip(unit["names"], unit["offsets"], unit["numels"],
                                              unit["shapes"]):
            saved = tensors.get(name)
            if saved is None or saved["shape"] != list(shape):
                found = "missing" if saved is None else f"shape {saved['shape']}"
                raise ValueError(f"checkpoint parameter {name!r} is {found}, the model "
                                 f"needs shape {list(shape)}: resume with the model flags "
                                 f"it was saved with")
            low, high = max(unit["start"], offset), min(unit["end"], offset + numel)
            if high > low:
                for key in STATE_NAMES:
                    owned[key][low - unit["start"]:high - unit["start"]] = \
                        saved[key][low - offset:high - offset]
        for key in STATE_NAMES:
            state[key].append(owned[key])
    device = engine.units[0].grad_acc.device if engine.units else torch.device("cpu")
    for key in STATE_NAMES:
        state[key] = [tensor.to(device) for tensor in state[key]]
    return state
