"""Durable file-system helpers shared by every checkpoint writer."""

from __future__ import annotations

import os

__all__ = ["fsync_dir", "write_file_atomic"]


def fsync_dir(path: str) -> None:
    """Flush a directory entry (a rename or a new file inside it) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_atomic(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the new one, never a part."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):  # no partial temporary file left behind
            os.remove(tmp)
        raise
    fsync_dir(os.path.dirname(os.path.abspath(path)))
