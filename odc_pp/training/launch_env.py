"""The torchrun environment of this process (torch-free: ``pretrain_gpt.py`` reads it to
report bad flags once, on the first rank, before importing torch)."""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["DistEnv", "read_env"]


@dataclass(frozen=True)
class DistEnv:
    """torchrun's ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int


def read_env() -> DistEnv:
    """The torchrun variables (single process when they are absent)."""
    return DistEnv(rank=int(os.environ.get("RANK", 0)),
                   world_size=int(os.environ.get("WORLD_SIZE", 1)),
                   local_rank=int(os.environ.get("LOCAL_RANK", 0)),
                   local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
