"""Token ids of Megatron indexed datasets checked against the model's vocabulary.

An id outside the embedding (``>= vocab_size``, or negative in a signed ``.bin``) would
train for a few steps and then fail inside the embedding lookup (an ``IndexError`` naming
nothing on the CPU, a device-side assert on a GPU). :func:`check_token_ids` reads the
whole ``.bin`` once when the dataset is opened, vectorised (NumPy over a memory map, in
blocks of :data:`BLOCK_TOKENS` ids), and names the file, document, position and id of the
first bad token. A ``.bin`` whose dtype cannot hold an id as large as the vocabulary
(``uint16`` under a vocabulary of 65536 or more) is not read at all.
"""

from __future__ import annotations

import numpy as np

__all__ = ["BLOCK_TOKENS", "check_token_ids", "first_bad_token"]

BLOCK_TOKENS = 1 << 24
"""Ids compared per NumPy operation (64 MiB of int32): bounded memory on any file."""


def first_bad_token(tokens: np.ndarray, vocab_size: int) -> int | None:
    """Index of the first id of ``tokens`` outside ``[0, vocab_size)``, or None."""
    info = np.iinfo(tokens.dtype)
    if info.min >= 0 and info.max < vocab_size:
        return None  # the dtype cannot hold a bad id
    for start in range(0, len(tokens), BLOCK_TOKENS):
        block = tokens[start:start + BLOCK_TOKENS]
        bad = block >= vocab_size
        if info.min < 0:
            bad |= block < 0
        where = np.flatnonzero(bad)
        if len(where):
            return start + int(where[0])
    return None


def check_token_ids(prefix: str, dataset, vocab_size: int) -> None:
    """ValueError naming ``prefix.bin``, the document (and sequence when documents hold
    several), the position in it and the id, when a token id of the opened megatron
    ``IndexedDataset`` lies outside ``[0, vocab_size)``."""
    index = dataset.index
    lengths = np.asarray(index.sequence_lengths, dtype=np.int64)
    if len(lengths) == 0:
        return
    itemsize = np.dtype(index.dtype).itemsize
    starts = np.asarray(index.sequence_pointers, dtype=np.int64) // itemsize
    bin_path = f"{prefix}.bin"
    end = int(starts[-1] + lengths[-1])
    tokens = np.memmap(bin_path, dtype=index.dtype, mode="r", shape=(end,))
    try:
        where = first_bad_token(tokens, vocab_size)
        value = None if where is None else int(tokens[where])
    finally:
        del tokens
    if where is None:
        return
    sequence = int(np.searchsorted(starts, where, side="right") - 1)
    position = where - int(starts[sequence])
    document = int(np.searchsorted(np.asarray(index.document_indices), sequence,
                                   side="right") - 1)
    which = f"document {document}" if document == sequence else \
        f"document {document} (sequence {sequence})"
    raise ValueError(f"--data-path {prefix}: {bin_path}: {which}, position {position}: token "
                     f"id {value} is outside the model's vocabulary [0, {vocab_size}) "
                     f"(--vocab-size, or the tokenizer padded to "
                     f"--make-vocab-size-divisible-by); the dataset was made with another "
                     f"tokenizer (give it: --tokenizer-model, or for Megatron's GPT-2 data "
                     f"--vocab-file and --merge-file), or the model needs a larger vocabulary")
