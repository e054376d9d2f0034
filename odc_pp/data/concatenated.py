"""Megatron's sample construction: documents concatenated into ``seq_length + 1``-token
samples (megatron.core's ``GPTDataset``), as opposed to odc-pp's post-training samples
(one document per sample, :mod:`.datasets`).

The indices are built as ``GPTDataset._build_document_sample_shuffle_indices`` builds
them, from the same inputs (document lengths, the split's document ids, the number of
samples the run consumes, the seed), so sample ``i`` holds the same tokens as Megatron's
``GPTDataset[i]``:

* the *document index*: the split's document ids repeated once per epoch needed for
  ``num_samples`` samples, shuffled with ``numpy.random.RandomState(seed)`` (a final
  epoch that gives under 80% of an epoch's samples is shuffled on its own);
* the *sample index*: where each ``seq_length``-token stride of that concatenated token
  stream starts (megatron.core's C++ ``build_sample_idx``; every sample is ``seq_length``
  inputs plus one extra label token, the last partial sample dropped);
* the *shuffle index*: a permutation of the samples (from the same random state).

Documents keep the end-of-document token they were written with (``preprocess_data.py``
appends it); ``--reset-position-ids``, ``--reset-attention-mask`` and ``--eod-mask-loss``
act on the EOD tokens of a sample's inputs as in Megatron's
``_get_ltor_masks_and_position_ids``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .samples import Sample

__all__ = ["EodHandling", "MegatronIndices", "build_megatron_indices", "ConcatenatedSamples",
           "SyntheticDocuments", "ltor_fields"]


@dataclass(frozen=True, kw_only=True)
class EodHandling:
    """Megatron's end-of-document flags (``GPTDatasetConfig``'s fields of the same name)."""

    eod: int
    """The end-of-document token id."""
    reset_position_ids: bool = False
    """Positions restart at 0 after every EOD of a sample's inputs."""
    reset_attention_mask: bool = False
    """A token attends only to tokens after the last EOD before it (its own document)."""
    eod_mask_loss: bool = False
    """No loss where the input token is the EOD (the prediction across documents)."""


@dataclass(frozen=True, kw_only=True)
class MegatronIndices:
    """The three indices of a ``GPTDataset``."""

    document_index: np.ndarray
    """int32 document ids, one per document per epoch, in reading order."""
    sample_index: np.ndarray
    """``[num_samples + 1, 2]``: (position in document_index, token offset) where each
    sample starts; sample ``i`` ends where ``i + 1`` starts (plus the extra token)."""
    shuffle_index: np.ndarray
    """Sample ``i`` of the dataset is row ``shuffle_index[i]`` of the sample index."""


def _num_epochs(tokens_per_epoch: int, num_samples: int | None, seq_length: int) -> int:
    if num_samples is None:
        return 1
    return max(1, -(-(num_samples * seq_length + 1) // tokens_per_epoch))


def _document_index(documents: np.ndarray, epochs: int, state: np.random.RandomState,
                    separate_final_epoch: bool) -> np.ndarray:
    if separate_final_epoch and epochs > 1:
        first = _document_index(documents, epochs - 1, state, False)
        return np.concatenate((first, _document_index(documents, 1, state, False)))
    index = np.tile(documents, epochs).astype(np.int32)
    state.shuffle(index)
    return index


def _shuffle_index(first: int, total: int, state: np.random.RandomState) -> np.ndarray:
    dtype = np.uint32 if total < np.iinfo(np.uint32).max - 1 else np.int64
    head = np.arange(first, dtype=dtype)
    state.shuffle(head)
    if first == total:
        return head
    tail = np.arange(first, total, dtype=dtype)
    state.shuffle(tail)
    return np.concatenate((head, tail))


def build_megatron_indices(sequence_lengths: np.ndarray, documents: np.ndarray, *,
                           seq_length: int, num_samples: int | None,
                           seed: int) -> MegatronIndices:
    """The indices ``GPTDataset`` builds for ``documents`` (ids into ``sequence_lengths``)
    when ``num_samples`` samples are requested (None: one epoch)."""
    from megatron.core.datasets import helpers

    lengths = np.ascontiguousarray(sequence_lengths, dtype=np.int32)
    documents = np.asarray(documents, dtype=np.int32)
    tokens_per_epoch = int(lengths[documents].sum())
    if tokens_per_epoch <= seq_length:
        raise ValueError(f"the documents hold {tokens_per_epoch} tokens, not enough for one "
                         f"--seq-length {seq_length} sample (+1 label token)")
    epochs = _num_epochs(tokens_per_epoch, num_samples, seq_length)
    separate, before_final = False, 0
    if epochs > 1:
        before_final = ((epochs - 1) * tokens_per_epoch - 1) // seq_length
        per_epoch = (tokens_per_epoch - 1) // seq_length
        separate = num_samples - before_final < int(0.80 * per_epoch)
    state = np.random.RandomState(seed)
    document_index = _document_index(documents, epochs, state, separate)
    sample_index = helpers.build_sample_idx(lengths, document_index, seq_length, epochs,
                                            tokens_per_epoch, True, True)
    count = sample_index.shape[0] - 1
    shuffle = _shuffle_index(before_final if separate else count, count, state)
    return MegatronIndices(document_index=document_index, sample_index=sample_index,
                           shuffle_index=shuffle)


def ltor_fields(inputs: np.ndarray, eod: EodHandling):
    """``(loss_mask, position_ids or None, segment_ids or None)`` of a sample's input
    tokens under Megatron's EOD flags (``_get_ltor_masks_and_position_ids``): position
    ids restart after an EOD (--reset-position-ids); segment ids count the EODs before a
    position, so attention stays within a document (--reset-attention-mask)."""
    is_eod = inputs == eod.eod
    loss_mask = np.ones(len(inputs), dtype=np.float32)
    if eod.eod_mask_loss:
        loss_mask[is_eod] = 0.0
    # documents start after each EOD: segment k holds the tokens after the k-th EOD
    segments = np.concatenate(([0], np.cumsum(is_eod)[:-1])).astype(np.int64)
    positions = None
    if eod.reset_position_ids:
        starts = np.flatnonzero(np.concatenate(([True], is_eod[:-1])))
        positions = np.arange(len(inputs)) - starts[segments]
    return loss_mask, positions, (segments if eod.reset_attention_mask else None)


class ConcatenatedSamples:
    """Megatron's samples over a document table (``sequence_lengths`` and
    ``get(document, offset, length)``, e.g. ``IndexedDataset``): sample ``i`` is
    ``GPTDataset[i]``'s ``seq_length + 1`` tokens. Every sample has the full length."""

    def __init__(self, table, documents: np.ndarray, *, seq_length: int,
                 num_samples: int | None, seed: int, eod: EodHandling, pad_id: int) -> None:
        self.table = table
        self.seq_length = seq_length
        self.eod = eod
        self.pad_id = pad_id
        self.indices = build_megatron_indices(table.sequence_lengths, documents,
                                              seq_length=seq_length, num_samples=num_samples,
                                              seed=seed)

    def __len__(self) -> int:
        return len(self.indices.shuffle_index)

    def length(self, index: int) -> int:
        return self.seq_length

    def tokens(self, index: int) -> np.ndarray:
        """The ``seq_length + 1`` token ids of sample ``index`` (GPTDataset's text)."""
        row = int(self.indices.shuffle_index[index])
        (first, offset), (last, end) = self.indices.sample_index[row:row + 2]
        docs = self.indices.document_index
        if first == last:
            return np.asarray(self.table.get(int(docs[first]), offset=int(offset),
                                             length=int(end - offset + 1)), dtype=np.int64)
        parts = [self.table.get(int(docs[first]), offset=int(offset))]
        parts += [self.table.get(int(docs[i])) for i in range(first + 1, last)]
        parts.append(self.table.get(int(docs[last]), offset=0, length=int(end + 1)))
        return np.concatenate(parts).astype(np.int64)

    def __getitem__(self, index: int) -> Sample:
        tokens = self.tokens(index)
        loss_mask, positions, segments = ltor_fields(tokens[:-1], self.eod)
        return Sample(tokens=tokens, loss_mask=loss_mask, position_ids=positions,
                      segment_ids=segments)


class SyntheticDocuments:
    """The synthetic corpus's documents, each followed by the EOD 0, as a document table
    for :class:`ConcatenatedSamples` (Megatron-style --mock-data: full-length samples).
    Holds enough documents for ``tokens`` tokens in one epoch, at most ``max_documents``
    (Megatron's mock dataset has 100000; more tokens are further epochs)."""

    def __init__(self, corpus, tokens: int, *, max_documents: int = 100_000) -> None:
        self.corpus = corpus
        lengths, total = [], 0
        while (total < tokens and len(lengths) < max_documents) or len(lengths) < 2:
            lengths.append(corpus.length(len(lengths)) + 2)  # L + 1 ids and the EOD
            total += lengths[-1]
        self.sequence_lengths = np.asarray(lengths, dtype=np.int32)

    def __len__(self) -> int:
        return len(self.sequence_lengths)

    def get(self, document: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        tokens = np.append(self.corpus[document].tokens, 0)
        stop = len(tokens) if length is None else offset + length
        return tokens[offset:stop]
