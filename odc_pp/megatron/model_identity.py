"""The one model-identity check of every load: a checkpoint holds *this* model, not only
tensors of the right shapes.

A model is identified by the arguments that define it, under Megatron-LM's names
(:data:`IDENTITY_FLAGS`: layers, widths, heads, query groups, head dim, padded vocabulary,
normalization, linear biases, position embedding, RoPE base / percent / scaling, tied
embeddings, SwiGLU, ...). Every kind of checkpoint records them:

* Megatron-LM torch_dist: ``common.pt``'s ``args`` (:func:`read_megatron_args`, read
  without running code from the file: every class other than a handful of plain
  containers unpickles as an inert placeholder); :func:`megatron_args` writes them into
  our exports, as Megatron-LM does;
* our own checkpoints: ``meta.json`` (:func:`identity_of_meta`, which also reads the
  checkpoints written before every key existed);
* Hugging Face directories: ``config.json``, merged into the flags when parsed (a
  contradicting flag is refused there).

:func:`identity_of_config` gives the identity of the model a run builds. Two checks
compare them, and :func:`check_model_identity` runs both:

* :func:`identity_differences`: the recorded arguments against this run's (a head count
  that keeps every shape, ``--num-attention-heads 8`` for 4, is refused as Megatron-LM's
  ``check_checkpoint_args`` does);
* :func:`tensor_differences`: tensors in the checkpoint that the model lacks (a linear
  bias under ``--disable-bias-linear``, a norm bias under ``--normalization RMSNorm``, a
  learned position embedding under ``--position-embedding-type rope``, the output layer
  of a tied model) or that the model needs and the checkpoint lacks, each group named by
  the flag that explains it (:func:`flag_of_tensor`).

A difference raises :class:`ModelIdentityError` (a ValueError: exit 2). ``--finetune``
loads deliberately into another model: the differences become notes saying what is
dropped, and only tensors the model needs and cannot get stay errors.
"""

from __future__ import annotations

import argparse
import collections
import os
import pickle
import re

__all__ = ["IDENTITY_FLAGS", "ModelIdentityError", "identity_of_config",
           "identity_of_megatron_args", "identity_of_meta", "identity_differences",
           "model_tensor_names", "layer_suffixes", "flag_of_tensor", "tensor_differences",
           "check_model_identity", "read_megatron_args", "megatron_args"]

IDENTITY_FLAGS: dict[str, str] = {
    "num_layers": "--num-layers",
    "hidden_size": "--hidden-size",
    "num_attention_heads": "--num-attention-heads",
    "ffn_hidden_size": "--ffn-hidden-size",
    "num_query_groups": "--num-query-groups (with --group-query-attention)",
    "kv_channels": "--kv-channels",
    "padded_vocab_size": "--vocab-size (or the tokenizer and --make-vocab-size-divisible-by)",
    "max_position_embeddings": "--max-position-embeddings",
    "normalization": "--normalization",
    "norm_epsilon": "--norm-epsilon",
    "apply_layernorm_1p": "--apply-layernorm-1p",
    "swiglu": "--swiglu",
    "add_bias_linear": "--disable-bias-linear",
    "add_qkv_bias": "--add-qkv-bias",
    "qk_layernorm": "--qk-layernorm",
    "position_embedding_type": "--position-embedding-type",
    "rotary_base": "--rotary-base",
    "rotary_percent": "--rotary-percent",
    "use_rope_scaling": "--use-rope-scaling",
    "rope_scaling_factor": "--rope-scaling-factor",
    "untie_embeddings_and_output_weights": "--untie-embeddings-and-output-weights "
                                           "(--untie-embeddings)",
    "num_experts": "--num-experts",
}
"""Megatron-LM's name of each model-defining argument -> the flag that sets it."""

# keys compared only when both sides satisfy the condition
_ONLY_WHEN = {
    "max_position_embeddings": lambda i: i.get("position_embedding_type") == "learned_absolute",
    "rotary_base": lambda i: i.get("position_embedding_type") == "rope",
    "rotary_percent": lambda i: i.get("position_embedding_type") == "rope",
    "use_rope_scaling": lambda i: i.get("position_embedding_type") == "rope",
    "rope_scaling_factor": lambda i: bool(i.get("use_rope_scaling")),
    "add_qkv_bias": lambda i: i.get("add_bias_linear") is False,
}
# Megatron-LM's defaults of the arguments that are not sizes
_MEGATRON_DEFAULTS = {"normalization": "LayerNorm", "norm_epsilon": 1e-5,
                      "apply_layernorm_1p": False, "swiglu": False, "add_bias_linear": True,
                      "add_qkv_bias": False, "qk_layernorm": False,
                      "position_embedding_type": "learned_absolute", "rotary_base": 10000,
                      "rotary_percent": 1.0, "use_rope_scaling": False,
                      "rope_scaling_factor": 8.0, "untie_embeddings_and_output_weights": False,
                      "num_experts": None}


class ModelIdentityError(ValueError):
    """A checkpoint holds another model than the flags describe (the message names the
    flags)."""


def identity_of_config(config) -> dict:
    """The identity of the model a :class:`~odc_pp.megatron.model.ModelConfig` builds."""
    heads = config.num_attention_heads
    scaling = config.rope_scaling
    return {"num_layers": config.num_layers, "hidden_size": config.hidden_size,
            "ffn_hidden_size": config.ffn_hidden_size or 4 * config.hidden_size,
            "num_attention_heads": heads, "num_query_groups": config.num_query_groups or heads,
            "kv_channels": config.kv_channels or config.hidden_size // heads,
            "padded_vocab_size": config.vocab_size,
            "max_position_embeddings": config.max_sequence_length,
            "normalization": config.normalization, "norm_epsilon": config.norm_epsilon,
            "apply_layernorm_1p": getattr(config, "apply_layernorm_1p", False),
            "swiglu": config.activation == "swiglu",
            "add_bias_linear": config.add_bias_linear, "add_qkv_bias": config.add_qkv_bias,
            "qk_layernorm": config.qk_layernorm,
            "position_embedding_type": config.position_embedding_type,
            "rotary_base": config.rotary_base, "rotary_percent": 1.0,
            "use_rope_scaling": scaling is not None,
            "rope_scaling_factor": scaling["factor"] if scaling else 8.0,
            "untie_embeddings_and_output_weights": not config.tie_embeddings,
            "num_experts": None}


def identity_of_megatron_args(args) -> dict:
    """The identity recorded by Megatron-LM's ``args`` (a Namespace or dict, after its
    ``validate_args``). Only arguments it holds are returned (nothing is guessed for an
    argument that an older Megatron-LM did not have)."""
    values = dict(vars(args)) if hasattr(args, "__dict__") else dict(args)
    out = {key: values[key] for key in IDENTITY_FLAGS if key in values}
    heads = values.get("num_attention_heads")
    if "num_query_groups" in out and not values.get("group_query_attention", False):
        out["num_query_groups"] = heads  # Megatron ignores it without the flag
    if out.get("kv_channels") is None and heads and values.get("hidden_size"):
        out["kv_channels"] = values["hidden_size"] // heads
    if out.get("ffn_hidden_size") is None and values.get("hidden_size"):
        out.pop("ffn_hidden_size", None)
    if "position_embedding_type" not in out and values.get("add_position_embedding") is False:
        out["position_embedding_type"] = "none"
    return {key: value for key, value in out.items()
            if value is not None or key == "num_experts"}


def identity_of_meta(meta: dict) -> dict:
    """The identity recorded by our ``meta.json`` (odc-pp's flag names; keys that
    checkpoints written before they existed lack take the GPT defaults). Compared with
    another meta's: query groups and head dim stay None where the flags left them to the
    head count."""
    heads, hidden = meta["num_attention_heads"], meta["hidden_size"]
    hf = meta.get("hf_config") or {}
    tied = meta["tie_embeddings"] if "tie_embeddings" in meta else \
        bool(hf.get("tie_word_embeddings")) and not meta.get("untie_embeddings", False)
    position = meta.get("position_embedding_type", "learned_absolute")
    return {"num_layers": meta["num_layers"], "hidden_size": hidden,
            "ffn_hidden_size": meta.get("ffn_hidden_size") or 4 * hidden,
            "num_attention_heads": heads,  # None below: the default of the heads
            "num_query_groups": meta.get("num_query_groups"),
            "kv_channels": meta.get("kv_channels"),
            "padded_vocab_size": meta.get("vocab_size"),
            "max_position_embeddings": meta.get("max_position_embeddings"),
            "normalization": meta.get("normalization", "LayerNorm"),
            "norm_epsilon": meta.get("norm_epsilon", 1e-5),
            "apply_layernorm_1p": meta.get("apply_layernorm_1p", False),
            "swiglu": meta.get("swiglu", False),
            "add_bias_linear": not meta.get("disable_bias_linear", False),
            "add_qkv_bias": meta.get("add_qkv_bias", False),
            "qk_layernorm": meta.get("qk_layernorm", False),
            "position_embedding_type": position,
            "rotary_base": meta.get("rotary_base", 10000.0), "rotary_percent": 1.0,
            "use_rope_scaling": meta.get("use_rope_scaling", False),
            "rope_scaling_factor": meta.get("rope_scaling_factor", 8.0),
            "untie_embeddings_and_output_weights": not tied, "num_experts": None}


def identity_differences(saved: dict, now: dict) -> list[str]:
    """One entry per model-defining argument that differs, in :data:`IDENTITY_FLAGS`
    order: ``"key: saved A vs now B (--flag)"``. Arguments the checkpoint does not
    record are not compared; conditional ones (the RoPE base under rope, ...) only where
    both sides have the condition."""
    out = []
    for key, flag in IDENTITY_FLAGS.items():
        if key not in saved or key not in now:
            continue
        condition = _ONLY_WHEN.get(key)
        if condition is not None and not (condition(saved) and condition(now)):
            continue
        if saved[key] != now[key]:
            out.append(f"{key}: saved {saved[key]} vs now {now[key]} ({flag})")
    return out


_LAYER = re.compile(r"^model\.decoder\.layers\.(\d+)\.(.*)$")
_TENSOR_KEYS = (  # (pattern on the canonical name, identity key that explains it)
    (re.compile(r"position_embeddings\.weight$"), "position_embedding_type"),
    (re.compile(r"^model\.output_layer\.weight$"), "untie_embeddings_and_output_weights"),
    (re.compile(r"(layernorm|layer_norm)[._]bias$"), "normalization"),
    (re.compile(r"[qk]_layernorm\."), "qk_layernorm"),
    (re.compile(r"linear_qkv\.bias$"), "add_bias_linear add_qkv_bias"),
    (re.compile(r"\.bias$"), "add_bias_linear"),
)


def model_tensor_names(config, layer_suffixes) -> set[str]:
    """The canonical global names of every tensor the whole model has (what a checkpoint
    of it holds): ``layer_suffixes`` are the names inside one decoder layer (layers are
    homogeneous); a tied model has no output layer."""
    names = {"model.embedding.word_embeddings.weight", "model.decoder.final_layernorm.weight"}
    if config.position_embedding_type == "learned_absolute":
        names.add("model.embedding.position_embeddings.weight")
    if config.normalization == "LayerNorm":
        names.add("model.decoder.final_layernorm.bias")
    if not config.tie_embeddings:
        names.add("model.output_layer.weight")
    return names | {f"model.decoder.layers.{layer}.{suffix}"
                    for layer in range(config.num_layers) for suffix in layer_suffixes}


def layer_suffixes(names) -> set[str]:
    """The names inside a decoder layer, from global parameter names."""
    return {match.group(2) for match in map(_LAYER.match, names) if match}


def flag_of_tensor(name: str, saved: dict | None, now: dict) -> str:
    """The flag whose difference explains a tensor present on one side only, with both
    values when the checkpoint records them."""
    match = _LAYER.match(name)
    if match and int(match.group(1)) >= now["num_layers"]:
        keys = ["num_layers"]
    else:
        keys = next((k.split() for pattern, k in _TENSOR_KEYS if pattern.search(name)), [])
    if saved:
        differing = [key for key in keys if key in saved and saved[key] != now.get(key)]
        keys = differing or keys
    if not keys:
        return "another architecture"
    return " / ".join(IDENTITY_FLAGS[key] + (f" (checkpoint {key}={saved[key]}, this run "
                                             f"{now.get(key)})" if saved and key in saved
                                             else "") for key in keys)


def tensor_differences(checkpoint_names, model_names, saved: dict | None,
                       now: dict) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """({flag: checkpoint tensors the model lacks}, {flag: model tensors the checkpoint
    lacks}), names sorted."""
    def grouped(names) -> dict[str, list[str]]:
        out: dict[str, list[str]] = collections.defaultdict(list)
        for name in sorted(names):
            out[flag_of_tensor(name, saved, now)].append(name)
        return dict(out)

    checkpoint_names, model_names = set(checkpoint_names), set(model_names)
    return grouped(checkpoint_names - model_names), grouped(model_names - checkpoint_names)


def _listed(groups: dict[str, list[str]], what: str) -> list[str]:
    return [f"{len(names)} {what} ({', '.join(names[:2])}{', ...' if len(names) > 2 else ''}): "
            f"{flag} differs" for flag, names in groups.items()]


def check_model_identity(source: str, *, saved: dict | None, now: dict,
                         checkpoint_names=None, model_names=None, finetune: bool = False,
                         fillable: dict[str, str] | None = None) -> list[str]:
    """Raise :class:`ModelIdentityError` naming every differing argument and every
    unused or missing tensor with its flag; with ``finetune`` return them as notes
    instead (what the load drops). Missing tensors stay errors unless ``fillable`` maps
    them to what the caller fills them with (an untied output layer: "a copy of the
    checkpoint's tied embedding")."""
    fillable = fillable or {}
    differences = identity_differences(saved, now) if saved else []
    unused, missing = ({}, {}) if checkpoint_names is None else tensor_differences(
        checkpoint_names, model_names, saved, now)
    unfilled = {flag: names for flag, names in missing.items()
                if not (finetune and set(names) <= set(fillable))}
    lacks = "checkpoint tensors this model lacks" + (" (dropped)" if finetune else "")
    needs = "tensors this model needs that the checkpoint lacks" + (
        f" (each {', '.join(sorted(set(fillable.values())))})"
        if finetune and fillable and not unfilled else "")
    problems = differences + _listed(unused, lacks) + _listed(missing, needs)
    if not problems:
        return []
    if finetune and not unfilled:
        return [f"--finetune: {source} holds another model, loaded anyway: {problem}"
                for problem in problems]
    hint = ("" if finetune else "; load it with the flags it was saved with, or pass "
            "--finetune to load its weights deliberately into this model (unused tensors "
            "are dropped, differing arguments reported)")
    raise ModelIdentityError(f"{source} holds another model than these flags: "
                             f"{'; '.join(problems)}{hint}")


# ----- Megatron-LM's common.pt ------------------------------------------------------------
class _Opaque:
    """Stands for any object of a class that is not allow-listed: nothing of it runs."""

    def __new__(cls, *args, **kwargs):
        return super().__new__(cls)

    def __init__(self, *args, **kwargs) -> None:
        self.args = args

    def __setstate__(self, state) -> None:
        self.state = state


def _unpickler_module():
    import torch

    allowed = {("argparse", "Namespace"): argparse.Namespace,
               ("collections", "OrderedDict"): collections.OrderedDict,
               ("torch._utils", "_rebuild_tensor_v2"): torch._utils._rebuild_tensor_v2,
               ("torch", "Size"): torch.Size, ("builtins", "set"): set,
               ("builtins", "frozenset"): frozenset}

    class Unpickler(pickle.Unpickler):
        def find_class(self, module, name):
            if (module, name) in allowed:
                return allowed[(module, name)]
            if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
                return getattr(torch, name)
            return type(name, (_Opaque,), {"__module__": f"opaque.{module}"})

    return type("restricted_pickle", (), {"Unpickler": Unpickler, "load": pickle.load,
                                          "__name__": "restricted_pickle"})


def read_megatron_args(directory: str) -> dict | None:
    """Megatron-LM's ``args`` in a torch_dist checkpoint's ``common.pt`` (as a dict), or
    None when it records none (megatron-core alone). Unpickled by a restricted
    unpickler: classes other than Namespace, OrderedDict, sets, sizes and dtypes become
    inert placeholders, so the file runs no code."""
    import torch

    path = os.path.join(directory, "common.pt")
    if not os.path.isfile(path):
        return None
    try:
        common = torch.load(path, map_location="cpu", weights_only=False,
                            pickle_module=_unpickler_module())
    except Exception as exc:  # noqa: BLE001 -- a damaged file: named, not a traceback
        raise ModelIdentityError(f"{path} is unreadable ({type(exc).__name__}: {exc})") \
            from exc
    args = common.get("args") if isinstance(common, dict) else None
    return dict(vars(args)) if isinstance(args, argparse.Namespace) else None


def megatron_args(config) -> argparse.Namespace:
    """Megatron-LM's ``args`` for a checkpoint of ``config`` written as one tp = 1, pp = 1
    model (what our exports put into ``common.pt``, as Megatron-LM does)."""
    identity = identity_of_config(config)
    return argparse.Namespace(
        **identity, group_query_attention=identity["num_query_groups"] != identity[
            "num_attention_heads"], add_position_embedding=config.position_embedding_type ==
        "learned_absolute", vocab_size=config.vocab_size, tensor_model_parallel_size=1,
        pipeline_model_parallel_size=1, ckpt_format="torch_dist", no_save_rng=True,
        no_save_optim=True)
