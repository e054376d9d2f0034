"""JSONL -> Megatron indexed datasets (``.bin`` / ``.idx``).

:func:`preprocess_megatron` is Megatron-LM's ``tools/preprocess_data.py`` (what
``tools/preprocess_data.py`` runs): for each ``--json-keys`` key one dataset
``{prefix}_{key}_document.bin/.idx``, one document per JSON line, written through
megatron-core's ``IndexedDatasetBuilder.add_document`` with one sequence per sentence
(a string value is one sentence, a list of strings its sentences; empty ones dropped),
the end-of-document token appended only with ``--append-eod``, the dtype
``DType.optimal_dtype(vocab size)``: byte for byte the files Megatron-LM writes for the
same input and tokenizer. ``--split-sentences`` is refused (Megatron-LM splits with
nltk's punkt model; give each document as a list of sentences instead). Beyond Megatron:
a ``messages`` / ``conversations`` key is rendered as one sentence with the tokenizer's
chat template (:func:`~odc_pp.data.datasets.encode_document`), blank lines are skipped,
and several ``--input`` files go into one dataset.

:func:`preprocess_jsonl` writes odc-pp's record formats (``text``, ``messages``,
``conversations``, ``input_ids``; each text plus end-of-document) into ``prefix.bin``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys

import numpy as np
import torch

from .chat import json_type
from .datasets import encode_document, encode_jsonl_file
from .tokenizers import TOKENIZER_TYPES, build_tokenizer, tokenizer_type_for

__all__ = ["preprocess_jsonl", "preprocess_megatron", "encode_line", "megatron_paths", "main"]

CHAT_KEYS = ("messages", "conversations")
"""``--json-keys`` whose values are conversations, rendered with the chat template."""
_CHUNK = 32  # lines per worker task, as Megatron-LM's imap


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


def megatron_paths(output_prefix: str, key: str) -> tuple[str, str]:
    """(``.bin``, ``.idx``) Megatron-LM's tool writes for ``key``:
    ``{prefix}_{key}_document``."""
    stem = f"{output_prefix}_{key}_document"
    return stem + ".bin", stem + ".idx"


def _sentences(value, key: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        for index, item in enumerate(value):
            if not isinstance(item, str):
                raise ValueError(f"{key!r}[{index}] must be a JSON string (a sentence), got "
                                 f"a JSON {json_type(item)}")
        return value
    raise ValueError(f"{key!r} must be a JSON string, got a JSON {json_type(value)} (a list "
                     f"of strings is read as the document's sentences)")


def encode_line(line: str, keys: list[str], tokenizer, *,
                append_eod: bool) -> dict[str, tuple[list[int], list[int]]]:
    """{key: (token ids, sentence lengths)} of one JSON line, as Megatron-LM's encoder:
    each sentence tokenized (no special tokens added), empty ones dropped, the
    end-of-document token appended to a non-empty document with ``append_eod`` (counted
    in the last sentence). ValueError saying what is wrong (callers add file:line)."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg})") from exc
    if not isinstance(record, dict):
        raise ValueError(f"a JSONL record must be a JSON object, got a JSON "
                         f"{json_type(record)}")
    out = {}
    for key in keys:
        if key not in record:
            raise ValueError(f"no key {key!r} (--json-keys {' '.join(keys)}); the record has "
                             f"{sorted(record)}")
        if key in CHAT_KEYS:
            sample = encode_document({key: record[key]}, tokenizer, 1 << 30)
            sentences = [list(sample.tokens)] if sample is not None else []
        else:
            sentences = [tokenizer.encode(text) for text in _sentences(record[key], key)]
        ids, lengths = [], []
        for sentence in sentences:
            if sentence:
                ids.extend(int(token) for token in sentence)
                lengths.append(len(sentence))
        if ids and append_eod:
            ids.append(int(tokenizer.eod))
            lengths[-1] += 1
        out[key] = (ids, lengths)
    return out


_WORKER: dict = {}


def _start_worker(tokenizer_args: dict, keys: list[str], append_eod: bool) -> None:
    _WORKER.update(tokenizer=build_tokenizer(**tokenizer_args), keys=keys,
                   append_eod=append_eod)


def _encode_task(task: tuple[str, int, bytes]):
    path, line_number, raw = task
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"{path}:{line_number}: not UTF-8 text ({exc.reason} at byte {exc.start})"
    try:
        return encode_line(line, _WORKER["keys"], _WORKER["tokenizer"],
                           append_eod=_WORKER["append_eod"])
    except ValueError as exc:
        return f"{path}:{line_number}: {exc}"


def _lines(paths: list[str]):
    """(path, line number, raw bytes) of every non-blank line, streamed."""
    for path in paths:
        with open(path, "rb") as handle:
            for line_number, raw in enumerate(handle, 1):
                if raw.strip():
                    yield path, line_number, raw


def _encoded(paths: list[str], tokenizer_args: dict, keys: list[str], append_eod: bool,
             workers: int):
    """Each line's :func:`encode_line` result (or its error message), in order: in this
    process, or on ``workers`` processes as Megatron-LM's pool (``imap``, in order)."""
    if workers == 1:
        _start_worker(tokenizer_args, keys, append_eod)
        yield from map(_encode_task, _lines(paths))
        return
    context = multiprocessing.get_context("spawn")
    with context.Pool(workers, initializer=_start_worker,
                      initargs=(tokenizer_args, keys, append_eod)) as pool:
        yield from pool.imap(_encode_task, _lines(paths), _CHUNK)


def preprocess_megatron(input_paths: list[str], output_prefix: str, *, tokenizer_args: dict,
                        json_keys: list[str], append_eod: bool = False,
                        workers: int = 1) -> dict[str, int]:
    """Megatron-LM's ``preprocess_data.py`` (module docstring): {key: documents written}.
    ``tokenizer_args``: :func:`~odc_pp.data.tokenizers.build_tokenizer`'s arguments. The
    files are written under temporary names and renamed when every line is encoded: an
    error (ValueError naming file:line) leaves no dataset behind."""
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    for path in input_paths:
        if not os.path.isfile(path):
            raise ValueError(f"--input {path!r}: no such file")
    if workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    if len(set(json_keys)) != len(json_keys):
        raise ValueError(f"--json-keys {' '.join(json_keys)} names a key twice")
    dtype = DType.optimal_dtype(build_tokenizer(**tokenizer_args).vocab_size)
    os.makedirs(os.path.dirname(os.path.abspath(output_prefix)), exist_ok=True)
    final = {key: megatron_paths(output_prefix, key) for key in json_keys}
    partial = {key: tuple(f"{path}.partial" for path in paths) for key, paths in final.items()}
    builders = {key: IndexedDatasetBuilder(partial[key][0], dtype=dtype) for key in json_keys}
    counts = dict.fromkeys(json_keys, 0)
    try:
        for result in _encoded(input_paths, tokenizer_args, json_keys, append_eod, workers):
            if isinstance(result, str):
                raise ValueError(result)
            for key, (ids, lengths) in result.items():
                builders[key].add_document(ids, lengths)  # a list, as Megatron-LM passes
                counts[key] += 1
        for key, builder in builders.items():
            builder.finalize(partial[key][1])
        for key in json_keys:
            for temporary, path in zip(partial[key], final[key]):
                os.replace(temporary, path)
    finally:
        for builder in builders.values():
            builder.data_file.close()
        for paths in partial.values():
            for path in paths:
                if os.path.exists(path):
                    os.remove(path)
    return counts


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="preprocess_data.py",
        description="JSONL -> Megatron indexed datasets {PREFIX}_{KEY}_document.bin/.idx, "
                    "as Megatron-LM's tools/preprocess_data.py")
    parser.add_argument("--input", nargs="+", required=True,
                        help="JSONL file(s): one document per line")
    parser.add_argument("--output-prefix", required=True,
                        help="writes PREFIX_KEY_document.bin/.idx per --json-keys key")
    parser.add_argument("--json-keys", nargs="+", default=["text"],
                        help="keys of each line to write, one dataset each (default: text)")
    parser.add_argument("--tokenizer-type", default=None, choices=TOKENIZER_TYPES,
                        help="default: GPT2BPETokenizer with --vocab-file/--merge-file, "
                             "HuggingFaceTokenizer with --tokenizer-model, else "
                             "ByteLevelTokenizer")
    parser.add_argument("--tokenizer-model", default=None, help="local HF tokenizer path")
    parser.add_argument("--vocab-file", default=None, help="GPT-2 BPE vocab.json")
    parser.add_argument("--merge-file", default=None, help="GPT-2 BPE merges.txt")
    parser.add_argument("--append-eod", action="store_true",
                        help="append the end-of-document token to every non-empty document")
    parser.add_argument("--workers", type=int, default=1,
                        help="processes that tokenize (the output does not depend on it)")
    parser.add_argument("--split-sentences", action="store_true",
                        help="refused: give each document as a JSON list of sentences")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.split_sentences:
            raise ValueError("--split-sentences is not supported: Megatron-LM splits "
                             "sentences with nltk's punkt model, which this tool does not "
                             "use; give each document as a JSON list of sentences (one "
                             "sequence each, as Megatron-LM reads its split files)")
        kind = tokenizer_type_for(args.tokenizer_type, args.tokenizer_model,
                                  vocab_file=args.vocab_file, merge_file=args.merge_file)
        tokenizer_args = {"tokenizer_type": kind, "tokenizer_model": args.tokenizer_model,
                          "vocab_file": args.vocab_file, "merge_file": args.merge_file}
        counts = preprocess_megatron(args.input, args.output_prefix,
                                     tokenizer_args=tokenizer_args, json_keys=args.json_keys,
                                     append_eod=args.append_eod, workers=args.workers)
    except ValueError as exc:
        print(f"preprocess_data.py: error: {exc}", file=sys.stderr)
        return 2
    for key, count in counts.items():
        print(f"wrote {count} documents to {megatron_paths(args.output_prefix, key)[0]} "
              f"(.idx beside it), tokenizer {kind}")
    return 0
