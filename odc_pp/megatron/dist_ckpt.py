"""Megatron-LM checkpoints in and out: megatron-core ``dist_checkpointing`` directories in
the ``torch_dist`` format (``--ckpt-format torch_dist``).

A Megatron-LM save directory holds ``latest_checkpointed_iteration.txt`` and one
``iter_0000010/`` per checkpoint (``.metadata``, ``*.distcp``, ``common.pt``,
``metadata.json``). The ``.distcp`` files are a ``torch.distributed.checkpoint`` store of
*global* tensors named by the ``ShardedTensor`` keys of ``GPTModel.sharded_state_dict()``:
``embedding.word_embeddings.weight``, ``decoder.layers.<submodule>`` with the decoder layers
stacked along a leading axis (``decoder.layers.<i>.<submodule>`` without that axis for
non-homogeneous layers), ``decoder.final_layernorm.weight``, ``output_layer.weight``; the
norms in front of attention and MLP under Transformer Engine's fused names
(``self_attention.linear_qkv.layer_norm_weight``: ``input_layernorm.weight`` here,
:data:`~odc_pp.megatron.recompute.CANONICAL_NORM_NAMES`). A global tensor is the tp = 1
tensor whatever the tensor-parallel size that saved it (megatron's SwiGLU ``linear_fc1`` is
``[gate; up]`` like ours), so reading needs no layout: :func:`read_megatron_tensors` loads
every tensor whole, without collectives, and :func:`odc_names` maps the names to the global
parameter names of :mod:`odc_pp.megatron.model` (layer indices global).

Optimizer state maps where megatron stores it per parameter: ``optimizer.state.exp_avg.<key>``,
``optimizer.state.exp_avg_sq.<key>`` and ``optimizer.state.fp32_param.<key>`` (megatron's
non-distributed optimizer, and the distributed optimizer's ``fully_sharded_model_space``
format). The distributed optimizer's default ``dp_reshardable`` format stores flat
per-data-parallel-rank buffers that name no parameter; they are skipped (reported).

Writing (:func:`save_megatron_checkpoint`) goes through megatron's own
``GPTModel.sharded_state_dict()`` and ``dist_checkpointing.save`` on a one-stage model, so
the keys are what megatron writes and ``dist_checkpointing.load`` reads them back into a
``GPTModel`` at any pipeline / tensor-parallel layout.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile

import torch

from odc_pp.fsutil import fsync_dir, write_file_atomic

from .compat import cpu_dist_checkpointing, megatron_sharded_state_dict
from .dcp_reader import check_files, load_tensors, read_metadata
from .recompute import canonical_name

__all__ = ["TRACKER", "is_megatron_checkpoint", "megatron_checkpoint_dir",
           "read_megatron_tensors", "odc_names", "odc_state_from_megatron",
           "save_megatron_checkpoint", "OPTIMIZER_STATES"]

TRACKER = "latest_checkpointed_iteration.txt"
"""Megatron-LM's file naming the latest iteration (or ``release``)."""
OPTIMIZER_STATES = {"fp32_param": "master", "exp_avg": "exp_avg", "exp_avg_sq": "exp_avg_sq"}
"""megatron's per-parameter optimizer state names -> ours."""
_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.*)$")


def is_megatron_checkpoint(path: str) -> bool:
    """``path`` is a Megatron-LM save directory (has its tracker file)."""
    return os.path.isfile(os.path.join(path, TRACKER))


def megatron_checkpoint_dir(load: str, iteration: int | None = None) -> tuple[int, str]:
    """(iteration, directory) of the checkpoint the tracker names (or ``iteration``);
    ValueError naming the file when it is not a torch_dist checkpoint."""
    directory = None
    if iteration is None:
        tracker = os.path.join(load, TRACKER)
        with open(tracker) as handle:
            text = handle.read().strip()
        if text == "release":
            iteration, directory = 0, os.path.join(load, "release")
        elif text.isdigit():
            iteration = int(text)
        else:
            raise ValueError(f"{tracker} holds {text!r}, neither an iteration nor 'release'")
    directory = directory or os.path.join(load, f"iter_{iteration:07d}")
    if not os.path.isfile(os.path.join(directory, ".metadata")):
        raise ValueError(f"--load {load}: {directory} is not a megatron-core torch_dist "
                         f"checkpoint (no .metadata); only --ckpt-format torch_dist is read "
                         f"(convert legacy 'torch' checkpoints with Megatron-LM's converter)")
    return iteration, directory


def read_megatron_tensors(directory: str) -> dict[str, torch.Tensor]:
    """Every tensor of a torch_dist checkpoint, whole (global shape), on the CPU. Local:
    no collective, every caller reads what it needs itself. Byte entries (``_extra_state``,
    RNG states, parameter groups) are left out. Read by :mod:`.dcp_reader`: no code in the
    files runs, and a missing, truncated or damaged file is a
    :class:`~.dcp_reader.DamagedCheckpointError` naming it."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = read_metadata(directory)
    check_files(directory, metadata)
    tensors = {key: torch.empty(entry.size, dtype=entry.properties.dtype)
               for key, entry in metadata.state_dict_metadata.items()
               if isinstance(entry, TensorStorageMetadata) and odc_names(key, 1) is not None}
    load_tensors(directory, tensors, metadata)
    return tensors


def odc_names(key: str, num_layers: int) -> list[str] | None:
    """Our global parameter name(s) of a megatron model key: one per decoder layer for a
    stacked ``decoder.layers.*`` key, else one; None for a key that is no model tensor."""
    if "_extra_state" in key or key.startswith(("optimizer.", "rng_state")):
        return None
    match = _LAYER.match(key)
    if match:
        return [f"model.decoder.layers.{match.group(1)}.{canonical_name(match.group(2))}"]
    if key.startswith("decoder.layers."):
        rest = canonical_name(key[len("decoder.layers."):])
        return [f"model.decoder.layers.{layer}.{rest}" for layer in range(num_layers)]
    return [f"model.{key}"]


def _split(key: str, tensor: torch.Tensor, num_layers: int) -> dict[str, torch.Tensor]:
    names = odc_names(key, num_layers)
    if names is None:
        return {}
    if len(names) == 1 and not (key.startswith("decoder.layers.") and not _LAYER.match(key)):
        return {names[0]: tensor}
    if tensor.shape[0] != num_layers:
        raise ValueError(f"megatron tensor {key!r} stacks {tensor.shape[0]} layers; the model "
                         f"has {num_layers} (--num-layers)")
    return {name: tensor[layer] for layer, name in enumerate(names)}


def odc_state_from_megatron(tensors: dict[str, torch.Tensor], *, num_layers: int
                            ) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
    """(weights by our global name, {"master" | "exp_avg" | "exp_avg_sq": {name: tensor}})
    from :func:`read_megatron_tensors`' result. The optimizer dict holds only the states
    the checkpoint has per parameter (empty for a dp_reshardable distributed optimizer)."""
    weights, optimizer = {}, {}
    for key, tensor in tensors.items():
        weights.update(_split(key, tensor, num_layers))
    pattern = re.compile(r"^optimizer\.state\.(" + "|".join(OPTIMIZER_STATES) + r")\.(.*)$")
    for key, tensor in tensors.items():
        match = pattern.match(key)
        if match:
            state = optimizer.setdefault(OPTIMIZER_STATES[match.group(1)], {})
            state.update(_split(match.group(2), tensor, num_layers))
    return weights, optimizer


def save_megatron_checkpoint(chunk, save: str, iteration: int, *, process_groups,
                             args=None) -> str:
    """Write ``chunk`` (a one-stage :class:`~odc_pp.megatron.model.GPTChunk` holding the
    whole model) as Megatron-LM does under ``--ckpt-format torch_dist``:
    ``save/iter_<iteration>/`` through megatron's ``dist_checkpointing.save`` with the
    model's ``sharded_state_dict()`` under ``"model"``, and the tracker file. ``args``:
    Megatron-LM's model-defining arguments (an ``argparse.Namespace``,
    :func:`~.model_identity.megatron_args`), stored in ``common.pt`` as Megatron-LM does
    and compared by every load. Needs ``torch.distributed`` (one process). The files are
    written into a temporary directory beside it, renamed to ``iter_<iteration>`` when
    complete (a failed save leaves nothing behind), and the tracker is written last.
    Returns the iteration directory."""
    from megatron.core import dist_checkpointing

    if not (chunk.is_first and chunk.is_last):
        raise ValueError("save_megatron_checkpoint needs the whole model in one chunk")
    directory = os.path.join(save, f"iter_{iteration:07d}")
    if os.path.exists(directory):
        raise ValueError(f"{directory} exists; choose another --output directory")
    os.makedirs(save, exist_ok=True)
    partial = tempfile.mkdtemp(prefix=f".iter_{iteration:07d}.", suffix=".partial", dir=save)
    try:
        state = {"model": megatron_sharded_state_dict(chunk.model, process_groups),
                 "iteration": iteration, "checkpoint_version": 3.0}
        if args is not None:
            state["args"] = args
        with cpu_dist_checkpointing():
            dist_checkpointing.save(state, partial)
        os.rename(partial, directory)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    fsync_dir(save)
    write_file_atomic(os.path.join(save, TRACKER), f"{iteration}\n".encode())
    return directory
