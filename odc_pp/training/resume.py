"""Resuming from ``--load``: exactly under the layout the checkpoint was saved with, or
resharded (:mod:`.resharding`) under another pipeline / data-parallel layout; with
``--finetune`` only the weights, from iteration 0 with a fresh optimizer."""

from __future__ import annotations

import torch

from .arguments import TrainingArgs
from .checkpointing import load_rank_state, read_latest
from .distributed import Topology
from .resharding import assemble_by_name, owned_state, unit_layout

__all__ = ["MODEL_KEYS", "LAYOUT_KEYS", "checkpoint_meta", "resume"]

# must equal the saved values (another model cannot be resumed)
MODEL_KEYS = ("num_layers", "hidden_size")
# may differ: the optimizer state is then resharded by parameter name
LAYOUT_KEYS = ("pp", "dp", "pipeline_schedule", "num_model_chunks", "dp_mode", "world_size")


def checkpoint_meta(args: TrainingArgs, topo: Topology) -> dict:
    """What a checkpoint records about the model and the layout that saved it."""
    return {"pp": topo.pp, "dp": topo.dp, "pipeline_schedule": args.pipeline_schedule,
            "num_model_chunks": args.num_model_chunks, "num_layers": args.num_layers,
            "hidden_size": args.hidden_size, "dp_mode": args.dp_mode,
            "world_size": topo.world_size}


def resume(parts, args: TrainingArgs, topo: Topology, set_rng_state) -> tuple[int, str]:
    """Load the newest checkpoint under ``args.load`` into ``parts`` (optimizer state and
    published parameter shards; RNG state too when the layout is unchanged). Returns
    (iteration to continue from, how it was resumed); (0, "") when there is none.
    ``--finetune``: the weights only (any layout), from iteration 0."""
    found = read_latest(args.load)
    if found is None:
        return 0, ""
    iteration, directory, meta = found
    now = checkpoint_meta(args, topo)
    model_changes = {k: (meta.get(k), now[k]) for k in MODEL_KEYS if meta.get(k) != now[k]}
    if model_changes:
        detail = ", ".join(f"{k}: saved {s} vs now {n}" for k, (s, n) in model_changes.items())
        raise ValueError(f"checkpoint {directory} holds another model ({detail}); resume "
                         f"with the model flags it was saved with")
    if args.finetune:
        return 0, _load_weights_only(parts, directory, meta, iteration)
    changed = [k for k in LAYOUT_KEYS if meta.get(k) != now[k]]
    if not changed:
        state = load_rank_state(directory, topo.rank)
        parts.optimizer.load_state_dict(state["optimizer"])
        parts.engine.finish_step()
        set_rng_state(state["rng"])
        return iteration, "exact"
    step, tensors = assemble_by_name(directory, meta["world_size"])
    parts.optimizer.load_state_dict(owned_state(tensors, step, parts.engine,
                                                unit_layout(parts.engine)))
    parts.engine.finish_step()
    detail = ", ".join(f"{k} {meta.get(k)} -> {now[k]}" for k in changed)
    return iteration, f"resharded ({detail}; RNG streams restart)"


def _load_weights_only(parts, directory: str, meta: dict, iteration: int) -> str:
    """--finetune: the checkpoint's master weights, fresh AdamW moments and step count."""
    _, tensors = assemble_by_name(directory, meta["world_size"])
    state = owned_state(tensors, 0, parts.engine, unit_layout(parts.engine))
    for key in ("exp_avg", "exp_avg_sq"):
        state[key] = [torch.zeros_like(tensor) for tensor in state[key]]
    parts.optimizer.load_state_dict(state)
    parts.engine.finish_step()
    return f"finetuning: weights of iteration {iteration}, fresh optimizer state"
