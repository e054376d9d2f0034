"""What autograd keeps for backward, for memory tests: the bytes of the distinct storages
an operation saves (a storage saved twice, or through views, counts once)."""

from __future__ import annotations

import torch

__all__ = ["saved_bytes"]


def saved_bytes(function, *args, exclude: tuple[torch.Tensor, ...] = ()) -> int:
    """Bytes of the storages ``function(*args)`` saves for backward, leaving out those of
    ``exclude`` (e.g. a module's weight, which it holds anyway)."""
    skipped = {t.untyped_storage().data_ptr() for t in exclude}
    storages = {}

    def pack(tensor):
        pointer = tensor.untyped_storage().data_ptr()
        if pointer not in skipped:
            storages[pointer] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        function(*args)
    return sum(storages.values())
