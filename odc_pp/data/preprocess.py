"""JSONL -> Megatron indexed dataset (``prefix.bin`` / ``prefix.idx``), one document per record."""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

from .datasets import encode_jsonl_file
from .tokenizers import TOKENIZER_TYPES, build_tokenizer, tokenizer_type_for

__all__ = ["preprocess_jsonl", "main"]


def preprocess_jsonl(input_paths: list[str], output_prefix: str, *, tokenizer_type: str,
                     tokenizer_model: str | None = None, max_length: int = 1 << 30) -> int:
    """Write every record's tokens (``text``, or ``messages`` rendered with role headers)
    as one document; returns the number of documents written. Loss masks are not kept:
    indexed datasets score every token."""
    from megatron.core.datasets.indexed_dataset import (DType, IndexedDatasetBuilder,
                                                        get_bin_path, get_idx_path)

    tokenizer = build_tokenizer(tokenizer_type, tokenizer_model)
    directory = os.path.dirname(os.path.abspath(output_prefix))
    os.makedirs(directory, exist_ok=True)
    builder = IndexedDatasetBuilder(get_bin_path(output_prefix),
                                    dtype=DType.optimal_dtype(tokenizer.vocab_size))
    documents = 0
    for path in input_paths:
        for _, _, sample in encode_jsonl_file(path, tokenizer, max_length):
            if sample is None:
                continue
            builder.add_item(torch.from_numpy(np.asarray(sample.tokens)))
            builder.end_document()
            documents += 1
    builder.finalize(get_idx_path(output_prefix))
    return documents


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--input", nargs="+", required=True, help="JSONL file(s)")
    parser.add_argument("--output-prefix", required=True, help="writes PREFIX.bin and PREFIX.idx")
    parser.add_argument("--tokenizer-type", default=None, choices=TOKENIZER_TYPES,
                        help="default: HuggingFaceTokenizer with --tokenizer-model, else "
                             "ByteLevelTokenizer")
    parser.add_argument("--tokenizer-model", default=None, help="local HF tokenizer path")
    args = parser.parse_args(argv)
    try:
        count = preprocess_jsonl(args.input, args.output_prefix,
                                 tokenizer_type=tokenizer_type_for(args.tokenizer_type,
                                                                   args.tokenizer_model),
                                 tokenizer_model=args.tokenizer_model)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {count} documents to {args.output_prefix}.bin/.idx")
    return 0
