"""Blended datasets: Megatron's ``--data-path W1 P1 W2 P2 ...``.

The weights are normalised. Sample ``i`` of the blend comes from the dataset whose count
so far lags its share the most (Megatron's ``build_blending_indices``: the argmax of
``weight * max(i, 1) - taken``, ties to the first), and is that dataset's next sample, read
through its own seeded :class:`~odc_pp.data.datasets.ShuffledSource` (a fresh order each
epoch). The mapping depends only on the weights, so every rank builds it alone, and a
resumed run (a fresh :class:`BlendedSource`) reads exactly the samples of an
uninterrupted one.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["parse_blend", "blend_indices", "BlendedSource"]


def parse_blend(items: Sequence[str]) -> tuple[list[float], list[str]] | None:
    """``[W1, P1, W2, P2, ...]`` -> (normalised weights, paths); None when ``items`` are
    plain paths (no weights). ValueError for a half-weighted list or bad weights."""
    def number(text: str) -> float | None:
        try:
            return float(text)
        except ValueError:
            return None

    if not items or number(items[0]) is None:
        return None
    if len(items) % 2:
        raise ValueError(f"--data-path {' '.join(items)}: a blend is weight-path pairs "
                         f"(W1 P1 W2 P2 ...); got an odd number of items")
    weights = [number(w) for w in items[0::2]]
    paths = list(items[1::2])
    if any(w is None or w < 0 for w in weights) or not sum(weights) > 0:
        raise ValueError(f"--data-path {' '.join(items)}: blend weights must be "
                         f"non-negative numbers with a positive sum")
    total = sum(weights)
    return [w / total for w in weights], paths


def blend_indices(weights: Sequence[float], start: int, stop: int,
                  taken: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(dataset, index within the dataset) of blend samples ``start`` .. ``stop - 1``;
    ``taken`` (int64, one per dataset) holds the counts before ``start`` and is updated."""
    w = np.asarray(weights, dtype=np.float64)
    datasets = np.empty(stop - start, dtype=np.int64)
    within = np.empty(stop - start, dtype=np.int64)
    for offset, sample in enumerate(range(start, stop)):
        chosen = int(np.argmax(w * max(sample, 1) - taken))
        datasets[offset] = chosen
        within[offset] = taken[chosen]
        taken[chosen] += 1
    return datasets, within


class BlendedSource:
    """Global sample id -> sample of the blend of ``sources`` (ShuffledSource-like:
    ``length``, ``__getitem__``, ``pad_id``) with normalised ``weights``."""

    _BLOCK = 4096

    def __init__(self, sources: Sequence, weights: Sequence[float]) -> None:
        if len(sources) != len(weights) or not sources:
            raise ValueError("a blend needs one weight per source")
        pads = {source.pad_id for source in sources}
        if len(pads) != 1:
            raise ValueError(f"blended datasets use different pad ids {sorted(pads)}")
        self.sources = list(sources)
        self.weights = [float(w) for w in weights]
        self.pad_id = pads.pop()
        self._taken = np.zeros(len(sources), dtype=np.int64)
        self._dataset = np.empty(0, dtype=np.int64)
        self._within = np.empty(0, dtype=np.int64)

    def locate(self, sample_id: int) -> tuple[int, int]:
        """(dataset, index within it) of blend sample ``sample_id``."""
        if sample_id < 0:
            raise IndexError(f"sample id {sample_id} < 0")
        while sample_id >= len(self._dataset):
            start = len(self._dataset)
            datasets, within = blend_indices(self.weights, start, start + self._BLOCK,
                                             self._taken)
            self._dataset = np.concatenate([self._dataset, datasets])
            self._within = np.concatenate([self._within, within])
        return int(self._dataset[sample_id]), int(self._within[sample_id])

    def length(self, sample_id: int) -> int:
        dataset, index = self.locate(sample_id)
        return self.sources[dataset].length(index)

    def __getitem__(self, sample_id: int):
        dataset, index = self.locate(sample_id)
        return self.sources[dataset][index]
