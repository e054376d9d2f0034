"""Megatron's ``--split``: train / valid / test parts of a dataset's documents.

``split_bounds("98,2,0", size)`` gives the document boundaries Megatron computes: the
weights are normalised, each part takes ``round(weight * size)`` documents in order, and
the rounding excess is taken off the end. :class:`DocumentRange` is one part as a
dataset (same ``length`` / ``__getitem__`` / ``pad_id`` interface), so it goes through
:class:`~odc_pp.data.datasets.ShuffledSource` like a whole dataset.
"""

from __future__ import annotations

__all__ = ["split_bounds", "DocumentRange", "SPLIT_NAMES"]

SPLIT_NAMES = ("train", "valid", "test")


def split_bounds(split: str, size: int) -> list[range]:
    """Document ranges of the train, valid and test parts of ``size`` documents."""
    try:
        weights = [float(part) for part in split.replace("/", ",").split(",")]
    except ValueError:
        raise ValueError(f"--split {split!r}: give comma-separated numbers, e.g. 98,2,0")
    if not 1 <= len(weights) <= 3 or any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"--split {split!r}: one to three non-negative weights with a "
                         f"positive sum")
    weights += [0.0] * (3 - len(weights))
    total = sum(weights)
    bounds = [0]
    for weight in weights:
        bounds.append(bounds[-1] + int(round(weight / total * float(size))))
    excess = bounds[-1] - size
    bounds = [bounds[0]] + [bound - excess for bound in bounds[1:]]
    return [range(max(0, bounds[i]), max(0, bounds[i + 1])) for i in range(3)]


class DocumentRange:
    """Documents ``documents`` (a range) of ``dataset`` as a dataset of their own."""

    def __init__(self, dataset, documents: range, *, name: str = "") -> None:
        if documents.stop > len(dataset):
            raise ValueError(f"{name or 'split'}: documents {documents} outside the "
                             f"dataset's {len(dataset)}")
        if len(documents) == 0:
            raise ValueError(f"the {name or 'split'} part of --split has no documents "
                             f"(dataset of {len(dataset)}); raise its weight")
        self.dataset = dataset
        self.documents = documents
        self.pad_id = dataset.pad_id

    def __len__(self) -> int:
        return len(self.documents)

    def length(self, index: int) -> int:
        return self.dataset.length(self.documents[index])

    def __getitem__(self, index: int):
        return self.dataset[self.documents[index]]
