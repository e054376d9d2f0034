#!/usr/bin/env python3
"""Export a pretrain_gpt.py checkpoint (any pipeline / data-parallel layout) as a Hugging
Face model directory that ``transformers.AutoModelForCausalLM.from_pretrained`` loads.

    python tools/export_hf.py --load ckpt --output hf_out [--max-shard-size 5GB]
        [--iteration 50] [--dtype bfloat16] [--tokenizer-from DIR | --no-tokenizer]

The weights are the optimizer's fp32 master weights reassembled by name
(``tools/export_checkpoint.py``), converted to HF names (``odc_pp/megatron/hf.py``) and
written as safetensors shards of at most ``--max-shard-size`` with
``model.safetensors.index.json``. ``config.json`` is the original one when the run started
from ``--hf-checkpoint`` (the checkpoint stores it), else one built from the model flags
(Llama-shaped models only). A config that ties the embeddings stays tied only if the
embedding and output layer are bitwise equal (tied training keeps them so on every
layout; --untie-embeddings trains them apart).
The dtype is the config's ``torch_dtype`` unless ``--dtype`` is given.

The tokenizer is copied by default, with its chat template (``chat_template.jinja``,
``chat_template.json`` and the template inside ``tokenizer_config.json``), so an SFT model
exported this way keeps the template transformers' ``apply_chat_template`` uses: from
``--tokenizer-from DIR``, else the directory the run's tokenizer came from (the
checkpoint's ``tokenizer_dir``: ``--tokenizer-model`` or ``--hf-checkpoint``).
``--no-tokenizer`` copies none.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_checkpoint import export  # noqa: E402  (the one full-state assembler)

from odc_pp.megatron.hf import (hf_state_dict, model_config_from_hf, parse_size,  # noqa: E402
                                save_hf_directory, torch_dtype)
from odc_pp.megatron.hf_config import hf_config_from_model  # noqa: E402
from odc_pp.training.checkpoint.checkpointing import checkpoint_dir, read_meta  # noqa: E402

__all__ = ["export_hf", "copy_tokenizer", "tokenizer_source", "main"]

_EMBEDDING = "model.embedding.word_embeddings.weight"
_OUTPUT = "model.output_layer.weight"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                    "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
                    "chat_template.jinja", "chat_template.json", "generation_config.json")
_TOKENIZERS = ("tokenizer.json", "tokenizer.model", "vocab.json")
"""One of them makes a directory hold a tokenizer."""
_CHAT_TEMPLATES = "additional_chat_templates"  # transformers' folder of named templates


def copy_tokenizer(source: str, output: str) -> list[str]:
    """Copy the tokenizer files of the HF directory ``source`` into ``output``, the chat
    template in every form the source holds it; the names copied (ValueError: no
    tokenizer there)."""
    copied = [name for name in _TOKENIZER_FILES
              if os.path.isfile(os.path.join(source, name))]
    if not set(_TOKENIZERS) & set(copied):
        raise ValueError(f"--tokenizer-from {source}: no tokenizer.json, tokenizer.model or "
                         f"vocab.json there")
    os.makedirs(output, exist_ok=True)
    for name in copied:
        shutil.copy2(os.path.join(source, name), os.path.join(output, name))
    templates = os.path.join(source, _CHAT_TEMPLATES)
    if os.path.isdir(templates):
        shutil.copytree(templates, os.path.join(output, _CHAT_TEMPLATES), dirs_exist_ok=True)
        copied.append(_CHAT_TEMPLATES)
    return copied


def tokenizer_source(load: str, iteration: int, given: str | None) -> str | None:
    """``given`` (--tokenizer-from), else the checkpoint's recorded tokenizer directory
    (None: the run had none, e.g. --mock-data or a byte-level tokenizer)."""
    if given:
        return given
    recorded = read_meta(checkpoint_dir(load, iteration)).get("tokenizer_dir")
    if recorded and any(os.path.isfile(os.path.join(recorded, name)) for name in _TOKENIZERS):
        return recorded
    return None  # e.g. an --hf-checkpoint directory holding only the weights


def export_hf(load: str, output: str, *, max_shard_size: int, iteration: int | None = None,
              dtype: str | None = None) -> tuple[int, dict, list[str]]:
    """(iteration, config written, shard names)."""
    iteration, state = export(load, iteration)
    meta = read_meta(checkpoint_dir(load, iteration))
    config = dict(meta.get("hf_config") or hf_config_from_model(meta))
    if meta.get("vocab_size") not in (None, config.get("vocab_size")):
        raise ValueError(f"checkpoint vocab_size {meta['vocab_size']} differs from the HF "
                         f"config's {config.get('vocab_size')}")
    tie = bool(config.get("tie_word_embeddings"))
    if tie and _OUTPUT in state and not torch.equal(state[_OUTPUT], state[_EMBEDDING]):
        tie = False  # trained apart (--untie-embeddings): export them untied
    config["tie_word_embeddings"] = tie
    if tie:
        state.pop(_OUTPUT, None)
    if dtype:
        config["torch_dtype"] = dtype
    # zero-centred norms (--apply-layernorm-1p): HF stores gamma = 1 + the stored weight
    model = model_config_from_hf(config,
                                 apply_layernorm_1p=meta.get("apply_layernorm_1p", False))
    tensors = hf_state_dict(state, model, dtype=torch_dtype(config.get("torch_dtype")),
                            tie=tie)
    shards = save_hf_directory(tensors, config, output, max_shard_size=max_shard_size)
    return iteration, config, shards


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load", required=True, help="the --save directory of the run")
    parser.add_argument("--output", required=True, help="HF model directory to write")
    parser.add_argument("--max-shard-size", default="5GB", help="largest safetensors shard")
    parser.add_argument("--iteration", type=int, help="default: the latest checkpoint")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                        help="default: the config's torch_dtype")
    tokenizer = parser.add_mutually_exclusive_group()
    tokenizer.add_argument("--tokenizer-from", "--copy-tokenizer-from", metavar="DIR",
                           dest="tokenizer_from",
                           help="copy the tokenizer (chat template included) of this HF "
                                "directory (default: the run's --tokenizer-model or "
                                "--hf-checkpoint directory)")
    tokenizer.add_argument("--no-tokenizer", action="store_true",
                           help="copy no tokenizer files")
    args = parser.parse_args(argv)
    try:
        iteration, config, shards = export_hf(args.load, args.output,
                                              max_shard_size=parse_size(args.max_shard_size),
                                              iteration=args.iteration, dtype=args.dtype)
        source = None if args.no_tokenizer else \
            tokenizer_source(args.load, iteration, args.tokenizer_from)
        copied = copy_tokenizer(source, args.output) if source else []
    except ValueError as error:
        print(f"export_hf.py: error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {args.output}: iteration {iteration}, {config['model_type']}, "
          f"{len(shards)} safetensors shard(s), tie_word_embeddings "
          f"{config['tie_word_embeddings']}")
    if copied:
        template = "with" if {"chat_template.jinja", "chat_template.json"} & set(copied) or \
            _has_inline_template(args.output) else "without"
        print(f"tokenizer from {source} ({template} a chat template): {', '.join(copied)}")
    elif not args.no_tokenizer:
        print("no tokenizer copied: the run recorded no tokenizer directory (give "
              "--tokenizer-from DIR)")
    return 0


def _has_inline_template(directory: str) -> bool:
    path = os.path.join(directory, "tokenizer_config.json")
    if not os.path.isfile(path):
        return False
    with open(path, encoding="utf-8") as handle:
        return bool(json.load(handle).get("chat_template"))


if __name__ == "__main__":
    sys.exit(main())
