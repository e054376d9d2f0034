"""A Megatron indexed dataset (``prefix.idx`` / ``prefix.bin``) checked before it is
opened: a truncated file or a ``.bin`` that is not the ``.idx``'s pair is one ValueError
naming the file and the byte range, never NumPy's "buffer is smaller than requested size"
or "mmap length is greater than file size".

The ``.idx`` (Megatron's ``_IndexReader``): 9 bytes of magic, a version (``<Q``, 1), a
dtype code (``<B``), the sequence count ``S`` and document count ``D`` (``<Q`` each: 34
bytes in all), then ``S`` int32 lengths, ``S`` int64 byte pointers into the ``.bin`` and
``D`` int64 document indices. The ``.bin`` holds the tokens: sequence ``i`` at
``pointer[i]``, ``length[i]`` tokens of the dtype, back to back, and nothing after.
"""

from __future__ import annotations

import os
import struct

import numpy as np

__all__ = ["check_indexed_pair"]

_MAGIC = b"MMIDIDX\x00\x00"
_HEADER = 34
_ITEM_BYTES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 8, 7: 4, 8: 2}
"""Megatron's dtype codes -> bytes per token (uint8, int8, int16, int32, int64, float64,
float32, uint16)."""


def check_indexed_pair(prefix: str, flag: str = "--data-path") -> None:
    """ValueError naming ``prefix.idx`` or ``prefix.bin`` (and the byte range) when either
    is truncated or damaged, or the two are not a pair."""
    idx, binary = f"{prefix}.idx", f"{prefix}.bin"
    where = f"{flag} {prefix}"
    item, count, documents = _header(idx, where)
    needed = _HEADER + 12 * count + 8 * documents
    size = os.path.getsize(idx)
    if size < needed:
        raise ValueError(f"{where}: {idx} is truncated: its header announces {count} "
                         f"sequences and {documents} documents, which need bytes 0-{needed}, "
                         f"the file has {size} bytes (bytes {size}-{needed} are missing; "
                         f"preprocess the data again)")
    lengths = np.fromfile(idx, dtype=np.int32, count=count, offset=_HEADER).astype(np.int64)
    pointers = np.fromfile(idx, dtype=np.int64, count=count, offset=_HEADER + 4 * count)
    expected = np.concatenate([[0], np.cumsum(lengths * item)])
    broken = np.flatnonzero((lengths < 0) | (pointers != expected[:-1]))
    if len(broken):
        first = int(broken[0])
        raise ValueError(f"{where}: {idx} is damaged: sequence {first} has length "
                         f"{lengths[first]} at byte {pointers[first]} of {binary}, where the "
                         f"sequences before it end at byte {expected[first]}")
    _check_bin(binary, idx, where, int(expected[-1]), count)


def _header(idx: str, where: str) -> tuple[int, int, int]:
    """(bytes per token, sequences, documents) of an ``.idx`` header."""
    size = os.path.getsize(idx)
    with open(idx, "rb") as handle:
        head = handle.read(_HEADER)
    if len(head) < _HEADER:
        raise ValueError(f"{where}: {idx} is truncated: {size} bytes, fewer than the "
                         f"{_HEADER}-byte header (bytes {size}-{_HEADER} are missing)")
    magic, version, code, count, documents = struct.unpack("<9sQBQQ", head)
    if magic != _MAGIC or version != 1 or code not in _ITEM_BYTES:
        raise ValueError(f"{where}: {idx} is not a Megatron indexed-dataset index (bytes "
                         f"0-{_HEADER}: magic {magic!r}, version {version}, dtype code {code})")
    return _ITEM_BYTES[code], count, documents


def _check_bin(binary: str, idx: str, where: str, needed: int, count: int) -> None:
    size = os.path.getsize(binary)
    if size < needed:
        raise ValueError(f"{where}: {binary} is truncated or not the pair of {idx}: the index "
                         f"places {count} sequences in bytes 0-{needed}, the file has {size} "
                         f"bytes (bytes {size}-{needed} are missing)")
    if size > needed:
        raise ValueError(f"{where}: {binary} is not the pair of {idx}: the index places "
                         f"{count} sequences in bytes 0-{needed}, the file has {size} bytes "
                         f"(bytes {needed}-{size} belong to no sequence); give the .bin and "
                         f".idx written together by one preprocessing run")
