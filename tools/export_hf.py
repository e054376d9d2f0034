#!/usr/bin/env python3
"""Export a pretrain_gpt.py checkpoint (any pipeline / data-parallel layout) as a Hugging
Face model directory that ``transformers.AutoModelForCausalLM.from_pretrained`` loads.

    python tools/export_hf.py --load ckpt --output hf_out [--max-shard-size 5GB]
        [--iteration 50] [--dtype bfloat16] [--copy-tokenizer-from DIR]

The weights are the optimizer's fp32 master weights reassembled by name
(``tools/export_checkpoint.py``), converted to HF names (``odc_pp/megatron/hf.py``) and
written as safetensors shards of at most ``--max-shard-size`` with
``model.safetensors.index.json``. ``config.json`` is the original one when the run started
from ``--hf-checkpoint`` (the checkpoint stores it), else one built from the model flags
(Llama-shaped models only). A config that ties the embeddings stays tied only if the
embedding and output layer are bitwise equal (tied training keeps them so on every
layout; --untie-embeddings trains them apart).
The dtype is the config's ``torch_dtype`` unless ``--dtype`` is given.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_checkpoint import export  # noqa: E402  (the one full-state assembler)

from odc_pp.megatron.hf import (hf_state_dict, model_config_from_hf, parse_size,  # noqa: E402
                                save_hf_directory, torch_dtype)
from odc_pp.megatron.hf_config import hf_config_from_model  # noqa: E402
from odc_pp.training.checkpointing import checkpoint_dir, read_meta  # noqa: E402

_EMBEDDING = "model.embedding.word_embeddings.weight"
_OUTPUT = "model.output_layer.weight"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                    "tokenizer.model", "vocab.json", "merges.txt", "generation_config.json")


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
    model = model_config_from_hf(config)
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
    parser.add_argument("--copy-tokenizer-from", metavar="DIR",
                        help="copy the tokenizer files of this HF directory into --output")
    args = parser.parse_args(argv)
    try:
        iteration, config, shards = export_hf(args.load, args.output,
                                              max_shard_size=parse_size(args.max_shard_size),
                                              iteration=args.iteration, dtype=args.dtype)
    except ValueError as error:
        print(f"export_hf.py: error: {error}", file=sys.stderr)
        return 2
    if args.copy_tokenizer_from:
        for name in _TOKENIZER_FILES:
            source = os.path.join(args.copy_tokenizer_from, name)
            if os.path.isfile(source):
                shutil.copy2(source, os.path.join(args.output, name))
    print(f"wrote {args.output}: iteration {iteration}, {config['model_type']}, "
          f"{len(shards)} safetensors shard(s), tie_word_embeddings "
          f"{config['tie_word_embeddings']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
