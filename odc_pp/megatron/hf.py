"""Hugging Face checkpoints in and out: weights of a local HF model directory into this
rank's chunks, and a full odc-pp state back into an HF directory.

Loading (:func:`load_hf_weights`). Each rank opens the safetensors files lazily
(``safetensors.safe_open``) and reads only the tensors its chunks' parameters are built
from (:func:`odc_pp.megatron.hf_config.megatron_to_hf_names`), whatever the pipeline
size, chunks or placement. Conversions: q/k/v are interleaved per query group into
megatron's fused ``linear_qkv`` (``[group][q heads of the group | k | v]``), gate/up are
concatenated into ``linear_fc1``; everything else is copied, except that a model with
zero-centred norms (``apply_layernorm_1p``) stores ``gamma - 1`` for HF's norm weight
``gamma`` (export adds the 1 back). A missing tensor raises ValueError naming it and the
directory.

Tied embeddings. An HF model with ``tie_word_embeddings`` has no ``lm_head``; when one
chunk holds embedding and output layer megatron shares the weight, otherwise the output
layer is a copy of the embedding whose gradient is summed with the embedding's
(:func:`odc_pp.megatron.model.tied_embedding_params`; ``--untie-embeddings`` trains two
independent weights instead). Export writes them tied only if they are bitwise equal.

Export (:func:`hf_state_dict`, :func:`save_hf_directory`): the inverse conversion, then
``config.json`` (the original fields when the run started from ``--hf-checkpoint``) and
safetensors shards of at most ``max_shard_size`` bytes with a
``model.safetensors.index.json``, written into a temporary directory and renamed.
"""

from __future__ import annotations

import json
import os
import re
import shutil

import torch

from ..dtypes import float_dtype
from .tp_layout import partition_of
from .hf_config import megatron_to_hf_names
from .model_identity import ModelIdentityError, layer_suffixes, model_tensor_names
from .safetensors_check import open_safetensors

__all__ = ["SafetensorsReader", "load_hf_weights", "unused_hf_tensors", "to_megatron", "hf_state_dict",
           "save_hf_directory", "parse_size", "model_config_from_hf",
           "torch_dtype", "INDEX_NAME"]

INDEX_NAME = "model.safetensors.index.json"
_SINGLE = "model.safetensors"


class SafetensorsReader:
    """The tensors of an HF directory (``model.safetensors`` or shards with an index),
    read one at a time; :attr:`read_names` records what was read."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        index = os.path.join(directory, INDEX_NAME)
        if os.path.isfile(index):
            try:
                with open(index) as handle:
                    self.weight_map = dict(json.load(handle)["weight_map"])
            except (ValueError, KeyError, TypeError) as exc:  # truncated or not an index
                raise ValueError(f"--hf-checkpoint {directory}: {INDEX_NAME} is damaged (no "
                                 f"JSON object with a 'weight_map': {exc})") from None
        elif os.path.isfile(os.path.join(directory, _SINGLE)):
            with open_safetensors(os.path.join(directory, _SINGLE),
                                  f"--hf-checkpoint {directory}: {_SINGLE}") as handle:
                self.weight_map = {name: _SINGLE for name in handle.keys()}
        else:
            raise ValueError(f"--hf-checkpoint {directory}: neither {INDEX_NAME} nor "
                             f"{_SINGLE} (only safetensors checkpoints are read)")
        self.read_names: set[str] = set()
        self._open: dict[str, object] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.weight_map

    def get(self, name: str) -> torch.Tensor:
        """One tensor; ValueError naming it when the directory lacks it, or naming its
        file when that is truncated or damaged."""
        filename = self.weight_map.get(name)
        if filename is None:
            raise ValueError(f"--hf-checkpoint {self.directory}: tensor {name!r} is missing "
                             f"(no safetensors file of the directory holds it)")
        if filename not in self._open:
            path = os.path.join(self.directory, filename)
            if not os.path.isfile(path):
                raise ValueError(f"--hf-checkpoint {self.directory}: shard {filename} (holding "
                                 f"tensor {name!r}) is missing")
            self._open[filename] = open_safetensors(
                path, f"--hf-checkpoint {self.directory}: shard {filename}")
        handle = self._open[filename]
        if name not in handle.keys():
            raise ValueError(f"--hf-checkpoint {self.directory}: tensor {name!r} is missing "
                             f"from {filename}")
        self.read_names.add(name)
        return handle.get_tensor(name)


def _heads(config) -> tuple[int, int, int]:
    """(attention heads, query groups, head dim) of a ModelConfig."""
    heads = config.num_attention_heads
    groups = config.num_query_groups or heads
    head_dim = config.kv_channels or config.hidden_size // heads
    return heads, groups, head_dim


def _zero_centred_norm(name: str, config) -> bool:
    """A norm weight that the model stores zero-centred (``apply_layernorm_1p``)."""
    return getattr(config, "apply_layernorm_1p", False) and name.endswith("layernorm.weight")


def to_megatron(name: str, parts: list[torch.Tensor], config) -> torch.Tensor:
    """The megatron parameter ``name`` from its HF tensors (order of
    :func:`megatron_to_hf_names`)."""
    if _zero_centred_norm(name, config):
        (gamma,) = parts
        return gamma.float() - 1
    if name.endswith("linear_qkv.weight") or name.endswith("linear_qkv.bias"):
        heads, groups, head_dim = _heads(config)
        q, k, v = parts
        tail = q.shape[1:]
        pieces = [q.reshape(groups, heads // groups * head_dim, *tail),
                  k.reshape(groups, head_dim, *tail), v.reshape(groups, head_dim, *tail)]
        return torch.cat(pieces, dim=1).reshape(-1, *tail)
    if name.endswith("linear_fc1.weight"):
        return torch.cat(parts, dim=0)
    (single,) = parts
    return single


def _from_megatron(name: str, tensor: torch.Tensor, config) -> list[torch.Tensor]:
    """Inverse of :func:`to_megatron`."""
    if _zero_centred_norm(name, config):
        return [tensor.float() + 1]
    if name.endswith("linear_qkv.weight") or name.endswith("linear_qkv.bias"):
        heads, groups, head_dim = _heads(config)
        tail = tensor.shape[1:]
        grouped = tensor.reshape(groups, (heads // groups + 2) * head_dim, *tail)
        q, k, v = torch.split(grouped, [heads // groups * head_dim, head_dim, head_dim], dim=1)
        return [part.reshape(-1, *tail) for part in (q, k, v)]
    if name.endswith("linear_fc1.weight"):
        return list(torch.chunk(tensor, 2, dim=0))
    return [tensor]


def model_config_from_hf(config: dict, **overrides):
    """A :class:`~odc_pp.megatron.model.ModelConfig` for an HF ``config.json`` dict
    (``overrides``: device, params_dtype, max_sequence_length, ...); tied as the config
    says, on any layout."""
    from .hf_config import flags_from_hf, llama3_rope_scaling
    from .model import ModelConfig

    flags = flags_from_hf(config)
    fields = dict(
        vocab_size=flags["vocab_size"], hidden_size=flags["hidden_size"],
        num_layers=flags["num_layers"], num_attention_heads=flags["num_attention_heads"],
        ffn_hidden_size=flags["ffn_hidden_size"],
        max_sequence_length=int(config.get("max_position_embeddings", 2048)),
        normalization="RMSNorm", norm_epsilon=flags["norm_epsilon"], activation="swiglu",
        num_query_groups=flags["num_query_groups"], kv_channels=flags["kv_channels"],
        position_embedding_type="rope", rotary_base=flags["rotary_base"],
        rope_scaling=llama3_rope_scaling(config), add_bias_linear=False,
        add_qkv_bias=flags["add_qkv_bias"], qk_layernorm=flags["qk_layernorm"],
        tie_embeddings=bool(config.get("tie_word_embeddings")))
    fields.update(overrides)
    return ModelConfig(**fields)


@torch.no_grad()
def load_hf_weights(chunks, directory: str, config, *, tied_in_hf: bool) -> set[str]:
    """Copy the HF weights into this rank's ``chunks`` (GPTChunk list); returns the HF
    tensor names read. Under tensor parallelism each rank takes its shard of the full
    megatron tensor (qkv rows per query group, SwiGLU's [gate_r; up_r]:
    :mod:`odc_pp.megatron.tp_layout`). ValueError names a missing tensor or a shape that
    differs."""
    reader = SafetensorsReader(directory)
    for chunk in chunks:
        tp = chunk.tensor_parallel
        for name, param in chunk.global_named_parameters():
            sources = megatron_to_hf_names(name, tied_in_hf=tied_in_hf)
            value = to_megatron(name, [reader.get(source) for source in sources], config)
            if tp.size > 1:  # this rank's shard of the full megatron tensor
                partition = partition_of(name, gated_mlp=chunk.gated_mlp)
                partition.check(value.shape, tp.size, name)
                value = partition.shard(value, tp.rank, tp.size)
            if tuple(value.shape) != tuple(param.shape):
                raise ValueError(f"--hf-checkpoint {directory}: {', '.join(sources)} give "
                                 f"shape {tuple(value.shape)} for {name}, the model needs "
                                 f"{tuple(param.shape)}")
            param.copy_(value.to(param.dtype))
    unused_hf_tensors(reader, chunks, config, tied_in_hf=tied_in_hf)
    return reader.read_names


_HF_TENSOR_FLAGS = (  # (pattern on an HF tensor name, the flag that explains it)
    (re.compile(r"\.[qkv]_proj\.bias$"), "--add-qkv-bias"),
    (re.compile(r"\.(q|k)_norm\."), "--qk-layernorm"),
    (re.compile(r"\.bias$"), "--disable-bias-linear"),
    (re.compile(r"^lm_head\.weight$"), "--untie-embeddings-and-output-weights"),
)


def unused_hf_tensors(reader: SafetensorsReader, chunks, config, *, tied_in_hf: bool) -> None:
    """The model-identity check of an HF load (:mod:`.model_identity`): a tensor of the
    directory that no parameter of the whole model is built from (an ``o_proj.bias`` of a
    Llama with ``attention_bias``, a layer beyond ``--num-layers``) is a
    ModelIdentityError naming the flag, not silently dropped. A tied model's ``lm_head``
    and rotary ``inv_freq`` buffers are not weights."""
    suffixes = layer_suffixes(name for chunk in chunks
                              for name, _ in chunk.global_named_parameters())
    used = set()
    for name in model_tensor_names(config, suffixes):
        try:
            used.update(megatron_to_hf_names(name, tied_in_hf=tied_in_hf))
        except ValueError:  # no HF counterpart (a learned position embedding)
            continue
    ignored = {"lm_head.weight"} if tied_in_hf else set()
    unused = sorted(name for name in reader.weight_map if name not in used | ignored
                    and not name.endswith("rotary_emb.inv_freq"))
    if not unused:
        return
    groups: dict[str, list[str]] = {}
    for name in unused:
        layer = re.match(r"^model\.layers\.(\d+)\.", name)
        flag = "--num-layers" if layer and int(layer.group(1)) >= config.num_layers else next(
            (flag for pattern, flag in _HF_TENSOR_FLAGS if pattern.search(name)),
            "the architecture (config.json's model_type)")
        groups.setdefault(flag, []).append(name)
    raise ModelIdentityError(
        f"--hf-checkpoint {reader.directory} holds tensors this model does not use: " +
        "; ".join(f"{len(names)} ({', '.join(names[:2])}{', ...' if len(names) > 2 else ''}"
                  f"): {flag} differs" for flag, names in groups.items()) +
        " (the model's flags come from config.json; this architecture is not supported as "
        "it is)")


def hf_state_dict(state: dict[str, torch.Tensor], config, *, dtype: torch.dtype,
                  tie: bool) -> dict[str, torch.Tensor]:
    """HF tensors from a full megatron state ``{canonical global name: tensor}``.
    ``tie``: write no ``lm_head`` (the output layer is the embedding)."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if tie and name == "output_layer.weight":
            continue
        sources = megatron_to_hf_names(name)
        for source, part in zip(sources, _from_megatron(name, tensor, config)):
            out[source] = part.to(dtype).contiguous()
    return out


def parse_size(text: str) -> int:
    """``5GB`` / ``500MB`` / ``100KB`` / ``1000`` -> bytes (decimal units, as HF)."""
    units = {"GB": 10 ** 9, "MB": 10 ** 6, "KB": 10 ** 3, "GIB": 2 ** 30, "MIB": 2 ** 20,
             "KIB": 2 ** 10, "B": 1}
    upper = text.strip().upper()
    for unit, scale in units.items():
        if upper.endswith(unit):
            number = upper[:-len(unit)].strip()
            break
    else:
        number, scale = upper, 1
    try:
        size = int(float(number) * scale)
    except ValueError:
        raise ValueError(f"--max-shard-size {text!r}: give a size like 5GB or 500MB") from None
    if size < 1:
        raise ValueError(f"--max-shard-size {text!r} must be positive")
    return size


def save_hf_directory(tensors: dict[str, torch.Tensor], config: dict, output: str, *,
                      max_shard_size: int) -> list[str]:
    """Write ``config.json`` and safetensors shards (<= ``max_shard_size`` bytes each,
    a tensor larger than that alone) with ``model.safetensors.index.json`` into
    ``output`` (created; must not hold a model already). Returns the shard names."""
    from safetensors.torch import save_file

    if os.path.exists(os.path.join(output, "config.json")):
        raise ValueError(f"--output {output} already holds a model (config.json); give a "
                         f"new directory")
    shards: list[list[str]] = [[]]
    size = 0
    for name in tensors:
        nbytes = tensors[name].numel() * tensors[name].element_size()
        if shards[-1] and size + nbytes > max_shard_size:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    parent = os.path.dirname(os.path.abspath(output))
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".tmp_{os.path.basename(os.path.abspath(output))}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    names, weight_map = [], {}
    for number, members in enumerate(shards, 1):
        filename = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        save_file({name: tensors[name] for name in members}, os.path.join(tmp, filename),
                  metadata={"format": "pt"})
        names.append(filename)
        weight_map.update({name: filename for name in members})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    with open(os.path.join(tmp, INDEX_NAME), "w") as handle:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, handle,
                  indent=2, sort_keys=True)
    with open(os.path.join(tmp, "config.json"), "w") as handle:
        json.dump(config, handle, indent=2)
    if os.path.isdir(output):
        for entry in os.listdir(tmp):
            os.replace(os.path.join(tmp, entry), os.path.join(output, entry))
        os.rmdir(tmp)
    else:
        os.rename(tmp, output)
    return names


def torch_dtype(name: str | None) -> torch.dtype:
    """The torch dtype of an HF ``torch_dtype`` string (default float32)."""
    if name is None:
        return torch.float32
    return float_dtype(name, what="torch_dtype")
