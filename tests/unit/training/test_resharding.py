"""Plain-logic checks of odc_pp/training/checkpoint/resharding.py: optimizer shards saved under one
layout (units, owned ranges) are reassembled by parameter name and cut into another layout;
the result equals slicing the full tensors directly. Gaps and foreign models are errors."""

from __future__ import annotations

import pytest
import torch

from odc_pp.megatron.model import EMBEDDING_WEIGHT, OUTPUT_WEIGHT
from odc_pp.training.checkpoint.checkpointing import rank_file, write_rank_file
from odc_pp.training.checkpoint.resharding import STATE_NAMES, assemble_by_name, owned_state

SHAPES = {"a": [3, 5], "b": [7], "c": [2, 2, 3]}


def _full(seed: int) -> dict[str, dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return {name: {key: torch.randn(torch.Size(shape).numel(), generator=generator)
                   for key in STATE_NAMES} for name, shape in SHAPES.items()}


def _unit(names: list[str], start: int, end: int) -> dict:
    offsets, offset = [], 0
    for name in names:
        offsets.append(offset)
        offset += torch.Size(SHAPES[name]).numel()
    return {"names": names, "offsets": offsets, "shapes": [SHAPES[n] for n in names],
            "numels": [torch.Size(SHAPES[n]).numel() for n in names],
            "start": start, "end": min(end, offset)}


def _flat(full: dict, unit: dict, key: str) -> torch.Tensor:
    return torch.cat([full[name][key] for name in unit["names"]])


def _save_rank(directory: str, rank: int, layout: list[dict], full: dict, step: int) -> None:
    optimizer = {"step": step}
    for key in STATE_NAMES:
        optimizer[key] = [_flat(full, unit, key)[unit["start"]:unit["end"]] for unit in layout]
    write_rank_file(rank_file(directory, rank), {"optimizer": optimizer, "layout": layout})


def test_reshard_by_name_equals_slicing_the_full_state(tmp_path):
    full = _full(0)
    # saved: two ranks, one unit ("a", "b") split at element 9, and a unit ("c",) split at 5
    _save_rank(tmp_path, 0, [_unit(["a", "b"], 0, 9), _unit(["c"], 0, 5)], full, step=7)
    _save_rank(tmp_path, 1, [_unit(["a", "b"], 9, 22), _unit(["c"], 5, 12)], full, step=7)
    step, tensors = assemble_by_name(str(tmp_path), 2)
    assert step == 7
    for name in SHAPES:
        for key in STATE_NAMES:
            assert torch.equal(tensors[name][key], full[name][key])
    # new layout: one unit ("b", "c", "a") of which this rank owns [4, 20)
    layout = [_unit(["b", "c", "a"], 4, 20)]
    state = owned_state(tensors, step, layout)
    for key in STATE_NAMES:
        assert torch.equal(state[key][0], _flat(full, layout[0], key)[4:20])


def test_gaps_and_other_models_are_errors(tmp_path):
    full = _full(1)
    _save_rank(tmp_path, 0, [_unit(["a", "b"], 0, 9)], full, step=1)
    _save_rank(tmp_path, 1, [_unit(["a", "b"], 10, 22)], full, step=1)  # element 9 ("a") lost
    with pytest.raises(ValueError, match="lacks parts of \\['a'\\]"):
        assemble_by_name(str(tmp_path), 2)
    _save_rank(tmp_path, 1, [_unit(["a", "b"], 9, 22)], full, step=1)
    step, tensors = assemble_by_name(str(tmp_path), 2)
    wider = [dict(_unit(["a"], 0, 15), shapes=[[3, 6]], numels=[18])]
    with pytest.raises(ValueError, match="'a' is shape \\[3, 5\\], the model needs shape "
                                         "\\[3, 6\\]"):
        owned_state(tensors, step, wider)
    with pytest.raises(ValueError, match="'c' is missing"):
        owned_state(tensors, step, [_unit(["c"], 0, 12)])
    write_rank_file(rank_file(str(tmp_path), 0), {"optimizer": {}})
    with pytest.raises(ValueError, match="records no parameter layout"):
        assemble_by_name(str(tmp_path), 2)


# ----- tied embeddings across pipeline sizes (issue 53, item 5) ------------------------------
TIED_SHAPES = {EMBEDDING_WEIGHT: [6, 4], **{f"model.decoder.layers.{i}.mlp.weight": [4, 4]
                                         for i in range(4)},
               "model.decoder.final_layernorm.weight": [4], OUTPUT_WEIGHT: [6, 4]}


def _tied_stage(pp: int, stage: int) -> list[str]:
    """The parameters of pipeline stage ``stage`` of 4 layers at ``pp`` (the last stage's
    output layer is a copy of the embedding when they live on different stages)."""
    per = 4 // pp
    names = [EMBEDDING_WEIGHT] if stage == 0 else []
    names += [f"model.decoder.layers.{i}.mlp.weight" for i in range(stage * per, (stage + 1) * per)]
    if stage == pp - 1:
        names.append("model.decoder.final_layernorm.weight")
        if pp > 1:
            names.append(OUTPUT_WEIGHT)
    return names


def _tied_unit(names: list[str], dp: int, dp_rank: int) -> dict:
    sizes = [torch.Size(TIED_SHAPES[n]).numel() for n in names]
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    total = sum(sizes)
    share = -(-total // dp)
    return {"names": names, "offsets": offsets, "shapes": [TIED_SHAPES[n] for n in names],
            "numels": sizes, "start": min(dp_rank * share, total),
            "end": min((dp_rank + 1) * share, total)}


def _reshard_to(tensors: dict, directory, pp: int, dp: int) -> None:
    """Write the checkpoint of ``tensors`` as saved at pp x dp (one unit per stage)."""
    directory.mkdir()
    for stage in range(pp):
        for dp_rank in range(dp):
            layout = [_tied_unit(_tied_stage(pp, stage), dp, dp_rank)]
            state = owned_state(tensors, 3, layout)
            write_rank_file(rank_file(str(directory), stage * dp + dp_rank),
                            {"optimizer": state, "layout": layout})


def test_tied_model_reshards_across_pipeline_sizes_keeping_the_tie(tmp_path):
    """Saved at pp=1 x dp=2 (one tied weight), resumed at pp=2, pp=4 (the output layer
    starts as the embedding's copy, moments too), back to pp=2 and pp=1: the round trip
    gives the original state bit for bit."""
    generator = torch.Generator().manual_seed(5)
    original = {name: {"shape": shape, **{key: torch.randn(torch.Size(shape).numel(),
                                                            generator=generator)
                                          for key in STATE_NAMES}}
                for name, shape in TIED_SHAPES.items() if name != OUTPUT_WEIGHT}
    _reshard_to(original, tmp_path / "pp1", pp=1, dp=2)
    tensors = assemble_by_name(str(tmp_path / "pp1"), 2)[1]
    for pp, dp in ((2, 1), (4, 1), (2, 2), (1, 1)):
        _reshard_to(tensors, tmp_path / f"pp{pp}_dp{dp}", pp=pp, dp=dp)
        tensors = assemble_by_name(str(tmp_path / f"pp{pp}_dp{dp}"), pp * dp)[1]
        assert (OUTPUT_WEIGHT in tensors) == (pp > 1)
        for key in STATE_NAMES:
            if pp > 1:  # the tie: the copy equals the embedding
                assert torch.equal(tensors[OUTPUT_WEIGHT][key], tensors[EMBEDDING_WEIGHT][key])
            for name, entry in original.items():
                assert torch.equal(tensors[name][key], entry[key]), (pp, dp, name, key)
