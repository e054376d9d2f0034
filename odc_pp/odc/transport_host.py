"""Host (shared-memory) side of the ODC transport: segment names, stale-segment cleanup,
dtype codes and the mapping from tensors to (allocation, byte offset).

Segment names are ``odcpp.<creator pid>.<group uid>.<what>``: the pid lets a later run
find segments whose creator died (killed run) and remove them; the uid (chosen by group
rank 0 at ``new_group``) keeps concurrent runs on one host apart.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from odc_pp import _C

__all__ = ["SEGMENT_PREFIX", "SHM_DIR", "DTYPE_CODES", "Allocation", "segment_name",
           "remove_stale_segments", "list_segments", "dtype_code", "tensor_from_segment"]

SEGMENT_PREFIX = "odcpp."
SHM_DIR = "/dev/shm"
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def segment_name(pid: int, uid: str, what: str) -> str:
    return f"/{SEGMENT_PREFIX}{pid}.{uid}.{what}"


def list_segments() -> list[str]:
    """Names (without the leading slash) of this transport's segments in /dev/shm."""
    try:
        return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(SEGMENT_PREFIX))
    except FileNotFoundError:
        return []


def remove_stale_segments() -> list[str]:
    """Unlink segments whose creating process is gone; returns the names removed."""
    removed = []
    for name in list_segments():
        fields = name[len(SEGMENT_PREFIX):].split(".")
        if not fields or not fields[0].isdigit() or _C.pid_alive(int(fields[0])):
            continue
        try:
            os.unlink(os.path.join(SHM_DIR, name))
            removed.append(name)
        except FileNotFoundError:
            pass  # another rank on this host removed it first
    return removed


def dtype_code(dtype: torch.dtype) -> int:
    if dtype not in DTYPE_CODES:
        raise ValueError(f"scatter_accumulate input must be float32, bfloat16 or float16, "
                         f"got {dtype}")
    return DTYPE_CODES[dtype]


def tensor_from_segment(segment, nbytes: int, shape, dtype: torch.dtype) -> torch.Tensor:
    """A tensor over a mapped segment; it keeps the mapping alive while it exists."""
    raw = torch.frombuffer(segment, dtype=torch.uint8)[:nbytes]
    return raw.view(dtype).view(shape)


@dataclass(kw_only=True)
class Allocation:
    """One symmetric allocation: the same size on every member, made in the same order."""

    alloc_id: int
    """Position in the group's allocation order (equal on every member)."""
    base: int
    """Address of this rank's buffer."""
    nbytes: int
    """Size in bytes (equal on every member)."""
    device: torch.device
    """Where the buffer lives (cpu or a cuda device)."""
    peer_bases: list[int | None] = field(default_factory=list)
    """Per group rank: the address at which that rank's buffer is mapped here, or None
    when it lives on another host (reached through the cross-host path)."""
    keep: list = field(default_factory=list)
    """Objects that must outlive the mapping (segments, IPC holders)."""
    local_bytes: torch.Tensor | None = None
    """This rank's CPU buffer as uint8 (served to cross-host peers); None on CUDA."""

    def contains(self, address: int, nbytes: int) -> bool:
        return self.base <= address and address + nbytes <= self.base + self.nbytes
