"""A safetensors file checked before it is opened: a truncated or damaged file is one
ValueError naming the file and the missing byte range, never ``SafetensorError: ...
incomplete metadata``.

The format: an 8-byte little-endian header length ``n``, ``n`` bytes of JSON (each tensor's
``data_offsets`` ``[begin, end]`` counted from the end of the header), then the data.
"""

from __future__ import annotations

import json
import os
import struct

__all__ = ["check_safetensors", "open_safetensors"]


def check_safetensors(path: str, what: str) -> None:
    """ValueError naming ``what`` (e.g. ``--hf-checkpoint DIR: shard F``) when ``path`` is
    shorter than its header says, or its header is not a safetensors header."""
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise ValueError(f"{what} is truncated: {size} bytes, fewer than the 8-byte "
                             f"header length (re-download or re-save the file)")
        length = struct.unpack("<Q", head)[0]
        if 8 + length > size:
            raise ValueError(f"{what} is truncated: its header needs bytes 8-{8 + length}, "
                             f"the file has {size} bytes (bytes {size}-{8 + length} are "
                             f"missing; re-download or re-save the file)")
        raw = handle.read(length)
    try:
        header = json.loads(raw)
        ends = [int(entry["data_offsets"][1]) for name, entry in header.items()
                if name != "__metadata__"]
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        raise ValueError(f"{what} is not a safetensors file: its {length}-byte header is "
                         f"not a safetensors JSON header ({exc})") from None
    needed = 8 + length + max(ends, default=0)
    if needed > size:
        raise ValueError(f"{what} is truncated: its tensors need bytes 0-{needed}, the file "
                         f"has {size} bytes (bytes {size}-{needed} are missing; re-download "
                         f"or re-save the file)")


def open_safetensors(path: str, what: str):
    """``safetensors.safe_open(path)`` after :func:`check_safetensors`; any other error
    of the library becomes a ValueError naming ``what``."""
    from safetensors import safe_open

    check_safetensors(path, what)
    try:
        return safe_open(path, framework="pt")
    except Exception as exc:  # SafetensorError and what the library raises
        raise ValueError(f"{what} cannot be read: {type(exc).__name__}: {exc}") from exc
