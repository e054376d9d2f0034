"""``--load`` of a Megatron-LM checkpoint (megatron-core dist_checkpointing, torch_dist) at
any of our layouts: every rank reads the whole tensors (:mod:`odc_pp.megatron.dist_ckpt`)
and cuts out the ranges its units own, as a resharded resume does
(:func:`~.resharding.owned_state`). Model weights always; the AdamW moments and fp32 master
weights when megatron stored them per parameter, else fresh moments (said on the console).
``--finetune``: weights only, from iteration 0. RNG states and the data position are not
taken from Megatron (the data order is this run's, from the iteration on).

Before anything is loaded the checkpoint must hold this model
(:func:`~odc_pp.megatron.model_identity.check_model_identity`): ``common.pt``'s ``args``
against the flags, and every checkpoint tensor against the model's tensors. With
``--finetune`` a difference is a note naming what is dropped; a missing output layer is
then taken from a tied checkpoint's embedding.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from ...megatron.dist_ckpt import (megatron_checkpoint_dir, odc_state_from_megatron,
                                  read_megatron_tensors)
from ...megatron.model_identity import (check_model_identity, identity_of_config,
                                       identity_of_megatron_args, layer_suffixes,
                                       model_tensor_names, read_megatron_args)
from ..distributed import Topology
from ..model_setup import model_config
from .resharding import owned_state, unit_layout

__all__ = ["resume_from_megatron", "check_megatron_identity"]

_OUTPUT, _EMBEDDING = "model.output_layer.weight", "model.embedding.word_embeddings.weight"


def check_megatron_identity(parts, args, directory: str, checkpoint_names) -> list[str]:
    """The model-identity check of a torch_dist load: ``common.pt``'s args (when Megatron-LM
    wrote them) and the checkpoint's tensor names (canonical global names) against this
    run's model. ModelIdentityError; with --finetune the notes of what is dropped."""
    vocab = parts.chunks[0].model.vocab_size
    config = model_config(args.model, vocab_size=vocab, device="cpu", num_stages=1)
    recorded = read_megatron_args(directory)
    names = layer_suffixes(name for chunk in parts.chunks
                           for name, _ in chunk.global_named_parameters())
    return check_model_identity(
        f"Megatron checkpoint {directory}",
        saved=identity_of_megatron_args(recorded) if recorded else None,
        now=identity_of_config(config), checkpoint_names=checkpoint_names,
        model_names=model_tensor_names(config, names), finetune=args.checkpoint.finetune,
        fillable={_OUTPUT: "a copy of the checkpoint's tied embedding"}
        if _EMBEDDING in checkpoint_names else None)


def _full_state(parts, args, directory: str) -> tuple[dict, bool, list[str]]:
    """({name: {"shape", "master", "exp_avg", "exp_avg_sq"}} for every parameter of this
    rank's units, whether the optimizer state came from the checkpoint, the identity
    check's notes)."""
    weights, optimizer = odc_state_from_megatron(read_megatron_tensors(directory),
                                                 num_layers=args.model.num_layers)
    notes = check_megatron_identity(parts, args, directory, set(weights))
    needed = {name for unit in unit_layout(parts.engine) for name in unit["names"]}
    for source in (weights, *optimizer.values()):
        if _OUTPUT in needed and _OUTPUT not in source and _EMBEDDING in source:
            source[_OUTPUT] = source[_EMBEDDING]  # tied in Megatron, a copy here
    missing = sorted(needed - set(weights))
    if missing:
        raise ValueError(f"megatron checkpoint {directory} lacks {missing[:3]} "
                         f"({len(missing)} parameters): another model or architecture "
                         f"(check --num-layers, --swiglu, --position-embedding-type, ...)")
    with_optimizer = not args.checkpoint.finetune and all(
        needed <= set(optimizer.get(key, {})) for key in ("exp_avg", "exp_avg_sq"))
    full = {}
    for name in needed:
        master = optimizer.get("master", {}).get(name, weights[name]) if with_optimizer \
            else weights[name]
        entry = {"shape": list(weights[name].shape),
                 "master": master.to(torch.float32).reshape(-1)}
        for key in ("exp_avg", "exp_avg_sq"):
            entry[key] = optimizer[key][name].to(torch.float32).reshape(-1) if with_optimizer \
                else torch.zeros(weights[name].numel())
        full[name] = entry
    return full, with_optimizer, notes


def resume_from_megatron(parts, args, topo: Topology, *, out=sys.stdout) -> tuple[int, str]:
    """Collective: load the Megatron-LM checkpoint under ``--load`` into ``parts``. Returns
    (iteration to continue from, how); every rank fails together, naming the problem."""
    box = [None]
    if topo.rank == 0:
        try:
            box = [("ok", megatron_checkpoint_dir(args.checkpoint.load))]
        except (OSError, ValueError) as exc:
            box = [("error", str(exc))]
    dist.broadcast_object_list(box, src=0)
    status, found = box[0]
    if status == "error":
        raise ValueError(found)
    iteration, directory = found
    state, verdict, notes = None, ("ok", ""), []
    try:
        full, with_optimizer, notes = _full_state(parts, args, directory)
        step = iteration if with_optimizer else 0  # Megatron's Adam steps once per iteration
        state = owned_state(full, step, unit_layout(parts.engine),
                            parts.engine.owned_params()[0].device)
    except (OSError, ValueError, RuntimeError) as exc:
        verdict = ("error", f"--load {args.checkpoint.load}: {exc}")
    verdicts = [None] * topo.world_size
    dist.all_gather_object(verdicts, (verdict, state is not None and with_optimizer))
    errors = [v[1] for (v, _) in verdicts if v[0] == "error"]
    if errors:
        raise ValueError(errors[0])
    parts.optimizer.load_state_dict(state)
    parts.engine.finish_step()
    if topo.rank == 0:
        for note in notes:
            print(f"note: {note}", file=out, flush=True)
    if args.checkpoint.finetune:
        return 0, f"finetuning: weights of Megatron checkpoint {directory}, fresh optimizer"
    if all(mapped for _, mapped in verdicts):
        return iteration, f"Megatron torch_dist checkpoint {directory}: weights and optimizer " \
                          f"state (RNG states and data position start afresh)"
    if topo.rank == 0:
        print(f"note: {directory} holds no per-parameter optimizer state (e.g. the distributed "
              f"optimizer's dp_reshardable format): optimizer state skipped, AdamW moments "
              f"start at zero", file=out, flush=True)
    return iteration, f"Megatron torch_dist checkpoint {directory}: weights only"
