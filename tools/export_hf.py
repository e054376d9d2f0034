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
checkpoint's ``tokenizer_dir``: ``--tokenizer-model``, or ``--hf-checkpoint`` whose own
tokenizer is the default). Only the tokenizer the weights were trained with is shipped:
its files must have the SHA-256 the checkpoint records (``tokenizer_sha256``), else the
export is refused; a run on the byte-level tokenizer ships none.
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

from odc_pp.data.tokenizer_identity import (CHAT_TEMPLATES_DIR, TOKENIZER_FILES,  # noqa: E402
                                            TOKENIZER_MARKERS, has_tokenizer,
                                            tokenizer_paths, tokenizer_sha256)
from odc_pp.megatron.hf import (hf_state_dict, model_config_from_hf, parse_size,  # noqa: E402
                                save_hf_directory, torch_dtype)
from odc_pp.megatron.hf_config import hf_config_from_model  # noqa: E402
from odc_pp.training.checkpoint.checkpointing import (checkpoint_dir, read_latest,  # noqa: E402
                                                      read_meta)

__all__ = ["export_hf", "copy_tokenizer", "tokenizer_source", "main"]

_EMBEDDING = "model.embedding.word_embeddings.weight"
_OUTPUT = "model.output_layer.weight"
_TOKENIZER_FILES = TOKENIZER_FILES + ("generation_config.json",)
_CHAT_TEMPLATES = CHAT_TEMPLATES_DIR


def copy_tokenizer(source: str, output: str) -> list[str]:
    """Copy the tokenizer files of the HF directory ``source`` into ``output``, the chat
    template in every form the source holds it; the names copied (ValueError: no
    tokenizer there)."""
    copied = [name for name in _TOKENIZER_FILES
              if os.path.isfile(os.path.join(source, name))]
    if not set(TOKENIZER_MARKERS) & set(copied):
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
    """The tokenizer directory to ship: ``given`` (--tokenizer-from), else the one the run
    used (the checkpoint's ``tokenizer_dir``); None when there is none to ship (the
    byte-level tokenizer, --mock-data). ValueError when its files are not those the run
    trained with (the checkpoint's ``tokenizer_sha256``), or when the run used no
    Hugging Face tokenizer and ``given`` would ship one."""
    meta = read_meta(checkpoint_dir(load, iteration))
    if "tokenizer_type" not in meta:  # written before the tokenizer was recorded
        return _unverified_source(meta.get("tokenizer_dir"), given)
    used, recorded = meta["tokenizer_type"], meta.get("tokenizer_sha256")
    source = given or meta.get("tokenizer_dir")
    if source is None:
        return None
    if used != "HuggingFaceTokenizer":
        raise ValueError(f"--tokenizer-from {source}: the run trained with "
                         f"{used or 'no tokenizer (--mock-data)'}, not a Hugging Face "
                         f"tokenizer; the weights never saw this one (drop --tokenizer-from)")
    if not os.path.isdir(source) or not has_tokenizer(source):
        raise ValueError(f"{_flag(given, source)}: no tokenizer there (none of "
                         f"{', '.join(TOKENIZER_MARKERS)})")
    now = tokenizer_sha256(tokenizer_paths(source), source)
    if recorded and now != recorded:
        raise ValueError(f"{_flag(given, source)}: its tokenizer files differ from those the "
                         f"run trained with (sha256 {now[:16]}..., the checkpoint records "
                         f"{recorded[:16]}...); give the run's tokenizer with "
                         f"--tokenizer-from DIR, or --no-tokenizer")
    return source


def _flag(given: str | None, source: str) -> str:
    return f"--tokenizer-from {source}" if given else f"the run's tokenizer {source}"


def _unverified_source(recorded: str | None, given: str | None) -> str | None:
    """An older checkpoint's: ``given``, else its recorded directory if it holds one."""
    if given:
        return given
    if recorded and has_tokenizer(recorded):
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
        iteration = args.iteration
        if iteration is None:  # the tokenizer is checked before any weight is written
            found = read_latest(args.load)
            if found is None:
                raise ValueError(f"no checkpoint under {args.load} (no 'latest' file)")
            iteration = found[0]
        source = None if args.no_tokenizer else \
            tokenizer_source(args.load, iteration, args.tokenizer_from)
        iteration, config, shards = export_hf(args.load, args.output,
                                              max_shard_size=parse_size(args.max_shard_size),
                                              iteration=iteration, dtype=args.dtype)
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
