"""Sample sources: the synthetic long-tailed corpus, JSONL post-training data, and
Megatron indexed datasets (.bin/.idx through ``megatron.core.datasets``).

Every source maps a global sample index to a :class:`Sample`, deterministically from the
seed, so every rank can rebuild any batch on its own (no data broadcast) and a resumed
run sees exactly the samples an uninterrupted one would. Finite sources are read in a
fresh seeded permutation each epoch.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .chat import check_messages, json_type, sharegpt_messages
from .record_checks import DEFAULT_MAX_DROPPED_FRACTION, FileReport, drop_reason
from .samples import Sample
from .tokenizers import Tokenizer

__all__ = ["SyntheticCorpus", "JsonlDataset", "IndexedTokenDataset", "ShuffledSource",
           "load_jsonl_documents", "encode_document", "encode_jsonl_file", "RECORD_KEYS"]


@dataclass(kw_only=True)
class SyntheticCorpus:
    """Infinite corpus with long-tailed (log-normal) lengths and a learnable pattern.

    Each document walks the vocabulary with a fixed stride drawn from ``strides``
    (token ``t+1 = t + stride mod vocab``), with a fraction ``noise`` of random tokens;
    a model can learn it, so the loss falls from about ``log(vocab_size)``.
    """

    vocab_size: int
    """Token ids are 1 .. vocab_size-1 (0 is end-of-document / padding)."""
    seq_length: int
    """Longest sample (input positions)."""
    seed: int = 1234
    """Everything is a function of (seed, sample index)."""
    min_length: int = 8
    """Shortest sample."""
    median_length: int | None = None
    """Median length before clipping; None: seq_length // 4."""
    sigma: float = 1.0
    """Log-normal shape: larger means a longer tail."""
    strides: tuple[int, ...] = (1, 2, 3, 5)
    """Possible strides of a document's walk."""
    noise: float = 0.05
    """Probability that a token is random instead of following the walk."""

    def __post_init__(self) -> None:
        if self.vocab_size < 8:
            raise ValueError(f"--vocab-size must be >= 8 for mock data, got {self.vocab_size}")
        if self.seq_length < self.min_length:
            raise ValueError(f"--seq-length must be >= {self.min_length}, got {self.seq_length}")
        if not 0 <= self.noise < 1 or self.sigma < 0:
            raise ValueError("noise must be in [0, 1) and sigma >= 0")

    @property
    def pad_id(self) -> int:
        return 0

    def length(self, index: int) -> int:
        rng = np.random.default_rng([self.seed, index, 0])
        median = self.median_length or max(self.min_length, self.seq_length // 4)
        value = rng.lognormal(mean=np.log(median), sigma=self.sigma)
        return int(np.clip(round(value), self.min_length, self.seq_length))

    def __getitem__(self, index: int) -> Sample:
        length = self.length(index)
        rng = np.random.default_rng([self.seed, index, 1])
        span = self.vocab_size - 1
        stride = int(rng.choice(self.strides))
        start = int(rng.integers(0, span))
        walk = (start + stride * np.arange(length + 1)) % span
        noisy = rng.random(length + 1) < self.noise
        walk[noisy] = rng.integers(0, span, size=int(noisy.sum()))
        return Sample(tokens=(walk + 1).astype(np.int64),
                      loss_mask=np.ones(length, dtype=np.float32))


RECORD_KEYS = ("text", "messages", "conversations", "input_ids")
"""The keys that name a JSONL record's format (exactly one per record)."""


def encode_document(record: dict, tokenizer: Tokenizer, seq_length: int, *,
                    vocab_size: int | None = None) -> Sample | None:
    """One JSONL record -> :class:`Sample`. Formats (exactly one key of :data:`RECORD_KEYS`):

    * ``{"text": "..."}``: a string, tokenized, plus end-of-document; every token scored
      (``null``, a number, a list or an object is an error, never its Python ``str()``).
    * ``{"messages": [{"role", "content"}, ...]}``: the tokenizer's chat template
      (``Tokenizer.encode_chat``); only assistant tokens scored.
    * ``{"conversations": [{"from", "value"}, ...]}``: ShareGPT's form of the same
      (:data:`~odc_pp.data.chat.SHAREGPT_ROLES`: ``human`` is the user, ``gpt`` the
      assistant), as Hugging Face SFT datasets store it.
    * ``{"input_ids": [...], "loss_mask": [...]}`` (pre-tokenized): L ids train L - 1
      predictions, so ``loss_mask`` (optional, default all 1) has L - 1 entries of 0 or 1:
      ``loss_mask[i]`` weighs the prediction of ``input_ids[i + 1]``. Ids must be
      ``< vocab_size``: the model's embedding size when given, else the tokenizer's.

    Truncated to ``seq_length + 1`` tokens; None when a text or chat record has fewer than
    2 tokens. A malformed record raises ValueError saying what is wrong (callers add
    file:line)."""
    if not isinstance(record, dict):
        raise ValueError(f"a JSONL record must be a JSON object with a 'text', 'messages' or "
                         f"'input_ids' key, got a JSON {json_type(record)}")
    present = [key for key in RECORD_KEYS if key in record]
    if len(present) > 1:
        raise ValueError(f"a JSONL record needs exactly one of {_KEYS}, got {present}")
    if not present:
        raise ValueError(f"JSONL record needs one of {_KEYS}, got {sorted(record)}")
    if "input_ids" in record:
        bound = (vocab_size, "the model's vocabulary size") if vocab_size else \
            (tokenizer.vocab_size, "the tokenizer's vocabulary size")
        tokens, predicted = _pretokenized(record, *bound)
        return Sample(tokens=tokens[:seq_length + 1], loss_mask=predicted[:seq_length])
    if "text" in record:
        text = record["text"]
        if not isinstance(text, str):
            raise ValueError(f"'text' must be a JSON string, got a JSON {json_type(text)} "
                             f"({json.dumps(text)[:40]})")
        tokens = tokenizer.encode(text) + [tokenizer.eod]
        scored = [1] * len(tokens)
    else:
        tokens, scored = tokenizer.encode_chat(_messages(record))
    tokens, scored = tokens[:seq_length + 1], scored[:seq_length + 1]
    if len(tokens) < 2:
        return None
    # loss_mask[i] scores the prediction of tokens[i + 1]
    return Sample(tokens=np.asarray(tokens, dtype=np.int64),
                  loss_mask=np.asarray(scored[1:], dtype=np.float32))


def _pretokenized(record: dict, vocab_size: int,
                  what: str) -> tuple[np.ndarray, np.ndarray]:
    """Validated ``(input_ids, loss_mask)`` arrays of a pre-tokenized record."""
    unknown = sorted(set(record) - {"input_ids", "loss_mask"})
    if unknown:
        raise ValueError(f"a pre-tokenized record has only 'input_ids' and 'loss_mask', "
                         f"got also {unknown}")
    ids = record["input_ids"]
    if not isinstance(ids, list) or len(ids) < 2:
        what = f"{len(ids)} ids" if isinstance(ids, list) else f"a JSON {json_type(ids)}"
        raise ValueError(f"'input_ids' must be a list of at least 2 token ids, got {what}")
    for position, value in enumerate(ids):
        if type(value) is not int or not 0 <= value < vocab_size:
            raise ValueError(f"input_ids[{position}] = {json.dumps(value)} is not a token id "
                             f"in [0, {vocab_size}) ({what})")
    if "loss_mask" not in record:
        return np.asarray(ids, dtype=np.int64), np.ones(len(ids) - 1, dtype=np.float32)
    mask = record["loss_mask"]
    if not isinstance(mask, list) or len(mask) != len(ids) - 1:
        what = f"{len(mask)} entries" if isinstance(mask, list) else f"a JSON {json_type(mask)}"
        raise ValueError(f"'loss_mask' must have len(input_ids) - 1 = {len(ids) - 1} entries "
                         f"(one per predicted token input_ids[1:]), got {what}")
    for position, value in enumerate(mask):
        if value not in (0, 1) or type(value) not in (int, bool):
            raise ValueError(f"loss_mask[{position}] = {json.dumps(value)} must be 0 or 1")
    if not any(mask):
        raise ValueError("'loss_mask' is all 0: the sample scores no token")
    return np.asarray(ids, dtype=np.int64), np.asarray(mask, dtype=np.float32)


_KEYS = "'text', 'messages', 'conversations' and 'input_ids'"


def _messages(record: dict) -> list[dict]:
    """A chat record's messages (``messages`` as is, ShareGPT ``conversations`` mapped)."""
    if "conversations" in record:
        return sharegpt_messages(record["conversations"])
    return record["messages"]


def _has_assistant_turn(record: dict) -> bool:
    return ("messages" in record or "conversations" in record) and \
        any(m["role"] == "assistant" for m in _messages(record))


def load_jsonl_documents(path: str) -> list[tuple[int, dict]]:
    """``(line number, record)`` of every non-blank line of a JSONL file; errors name
    ``path:line``."""
    if not os.path.isfile(path):
        raise ValueError(f"--data-path {path!r}: no such JSONL file")
    records = []
    with open(path, "rb") as handle:
        for line_number, raw in enumerate(handle, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"{path}:{line_number}: not UTF-8 text ({exc.reason} at "
                                 f"byte {exc.start})") from exc
            if not line.strip():
                continue
            try:
                records.append((line_number, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{line_number}: not valid JSON ({exc.msg})") from exc
    return records


def encode_jsonl_file(path: str, tokenizer: Tokenizer, seq_length: int, *,
                      vocab_size: int | None = None) -> list[tuple[int, dict, Sample | None]]:
    """``(line number, record, sample or None)`` of every record of a JSONL file
    (:func:`encode_document`); a malformed record raises ValueError naming ``path:line``."""
    out = []
    for line_number, record in load_jsonl_documents(path):
        try:
            out.append((line_number, record, encode_document(record, tokenizer, seq_length,
                                                             vocab_size=vocab_size)))
        except ValueError as exc:
            raise ValueError(f"{path}:{line_number}: {exc}") from exc
    return out


class JsonlDataset:
    """Documents of JSONL files, tokenized once at construction. Every file must give at
    least one sample with scored tokens; errors name the file (and line). Records that give
    no sample and samples truncation left unscored are counted per file
    (:attr:`reports`, :mod:`~odc_pp.data.record_checks`)."""

    def __init__(self, paths: Sequence[str], tokenizer: Tokenizer, seq_length: int, *,
                 vocab_size: int | None = None,
                 max_dropped_fraction: float = DEFAULT_MAX_DROPPED_FRACTION,
                 drop_unscored: bool = False, flag: str = "--data-path") -> None:
        """``vocab_size``: the model's embedding size, the bound of pre-tokenized ids
        (default: the tokenizer's vocabulary); ``max_dropped_fraction``:
        --max-dropped-records-fraction; ``drop_unscored``: --drop-unscored-samples."""
        self.pad_id = tokenizer.pad
        self.seq_length = seq_length
        self.samples: list[Sample] = []
        self.reports: list[FileReport] = []
        """Per file: records, dropped records, unscored samples."""
        for path in paths:
            report = FileReport(path=path, flag=flag, drop_unscored=drop_unscored)
            encoded = _encode_checked(path, tokenizer, seq_length, vocab_size, report)
            usable = [s for _, _, s in encoded if s is not None and s.num_loss_tokens > 0]
            if not usable:
                raise ValueError(_why_unusable(path, encoded, seq_length))
            report.check(max_dropped_fraction)
            self.samples += [s for _, _, s in encoded if s is not None and (
                s.num_loss_tokens > 0 or not drop_unscored)]
            self.reports.append(report)

    def notes(self) -> list[str]:
        """The data summary's lines: dropped records and unscored samples per file."""
        return [note for report in self.reports for note in report.notes(self.seq_length)]

    def __len__(self) -> int:
        return len(self.samples)

    def length(self, index: int) -> int:
        return self.samples[index].length

    def __getitem__(self, index: int) -> Sample:
        return self.samples[index]


def _chat_messages(record) -> list[dict] | None:
    """The validated messages of a chat record (exactly one of ``messages`` /
    ``conversations``); None for other records (:func:`encode_document` judges them)."""
    if not isinstance(record, dict) or \
            [key for key in RECORD_KEYS if key in record] not in (["messages"], ["conversations"]):
        return None
    return check_messages(_messages(record))


def _encode_checked(path: str, tokenizer: Tokenizer, seq_length: int, vocab_size: int | None,
                    report: FileReport) -> list[tuple[int, dict, Sample | None]]:
    """:func:`encode_jsonl_file` that counts into ``report``: records dropped (None
    samples; chat records with an unknown role or no assistant turn are not encoded) and
    samples truncation left unscored."""
    out = []
    for line_number, record in load_jsonl_documents(path):
        report.records += 1
        try:
            why = drop_reason(_chat_messages(record))
            sample = None if why else encode_document(record, tokenizer, seq_length,
                                                      vocab_size=vocab_size)
        except ValueError as exc:
            raise ValueError(f"{path}:{line_number}: {exc}") from exc
        if sample is None:
            report.dropped.append((line_number, why or "fewer than 2 tokens"))
        elif sample.num_loss_tokens == 0:
            report.unscored.append(line_number)
        out.append((line_number, record, sample))
    return out


def _why_unusable(path: str, encoded: list, seq_length: int) -> str:
    """Why a JSONL file gave no sample with scored tokens (the file named)."""
    if not encoded:
        return f"--data-path {path}: no records (the file is empty)"
    if not any("text" in record or "input_ids" in record or _has_assistant_turn(record)
               for _, record, _ in encoded):
        return (f"--data-path {path}: no record has an assistant turn (only assistant "
                f"replies are scored in 'messages' records); add assistant messages or use "
                f"'text' records")
    return (f"--data-path {path}: no usable documents (every record has fewer than 2 "
            f"tokens, or its scored tokens lie beyond --seq-length {seq_length})")


class IndexedTokenDataset:
    """Documents of Megatron indexed datasets (``prefix.bin`` / ``prefix.idx``), one
    sample per document, truncated to ``seq_length + 1`` tokens (post-training keeps
    document boundaries; :attr:`sequence_lengths` and :meth:`get` are the document table
    that :class:`~.concatenated.ConcatenatedSamples` concatenates as Megatron does). With ``vocab_size`` (the model's embedding
    rows) every token id of every ``.bin`` is checked when it is opened
    (:func:`~.token_check.check_token_ids`): an id outside ``[0, vocab_size)`` is a
    ValueError naming the file, document, position and id."""

    def __init__(self, prefixes: Sequence[str], seq_length: int, pad_id: int, *,
                 vocab_size: int | None = None, flag: str = "--data-path") -> None:
        """``flag``: the flag that named the prefixes (in errors)."""
        from megatron.core.datasets.indexed_dataset import IndexedDataset

        from .indexed_check import check_indexed_pair

        from .token_check import check_token_ids

        self.pad_id = pad_id
        self.seq_length = seq_length
        self.parts = []
        for prefix in prefixes:
            if not IndexedDataset.exists(prefix):
                raise ValueError(f"{flag} {prefix!r}: no {prefix}.bin / {prefix}.idx "
                                 "(make them with tools/preprocess_data.py)")
            check_indexed_pair(prefix, flag)  # truncated or mismatched: named, with bytes
            self.parts.append(IndexedDataset(prefix))
            if vocab_size is not None:
                check_token_ids(prefix, self.parts[-1], vocab_size)
        self.offsets = np.cumsum([0] + [len(p) for p in self.parts])
        long_enough = np.concatenate([p.sequence_lengths >= 2 for p in self.parts])
        self.valid = np.flatnonzero(long_enough)
        if len(self.valid) == 0:
            raise ValueError(f"--data-path {list(prefixes)}: no document has 2 tokens")

    def __len__(self) -> int:
        return len(self.valid)

    @property
    def sequence_lengths(self) -> np.ndarray:
        """Token counts of every document of every prefix, in order (the document table
        of Megatron's concatenated samples: ids are positions in this array)."""
        return np.concatenate([p.sequence_lengths for p in self.parts]).astype(np.int32)

    def get(self, document: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens ``offset .. offset + length`` of document ``document`` of
        :attr:`sequence_lengths` (``IndexedDataset.get`` over the prefixes)."""
        part = int(np.searchsorted(self.offsets, document, side="right") - 1)
        return self.parts[part].get(document - int(self.offsets[part]), offset=offset,
                                    length=length)

    def _locate(self, index: int):
        flat = int(self.valid[index])
        part = int(np.searchsorted(self.offsets, flat, side="right") - 1)
        return self.parts[part], flat - int(self.offsets[part])

    def length(self, index: int) -> int:
        part, local = self._locate(index)
        return min(int(part.sequence_lengths[local]), self.seq_length + 1) - 1

    def __getitem__(self, index: int) -> Sample:
        part, local = self._locate(index)
        tokens = np.asarray(part[local][:self.seq_length + 1], dtype=np.int64)
        return Sample(tokens=tokens, loss_mask=np.ones(len(tokens) - 1, dtype=np.float32))


class ShuffledSource:
    """Global sample index -> sample of a finite dataset, a new permutation each epoch
    (seeded); the synthetic corpus is infinite and read as is."""

    def __init__(self, dataset, *, seed: int, shuffle: bool = True) -> None:
        self.dataset = dataset
        self.seed = seed
        self.shuffle = shuffle
        self.pad_id = dataset.pad_id
        self._permutations: dict[int, np.ndarray] = {}

    def _index(self, sample_id: int) -> int:
        if not hasattr(self.dataset, "__len__"):
            return sample_id
        size = len(self.dataset)
        epoch, offset = divmod(sample_id, size)
        if not self.shuffle:
            return offset
        if epoch not in self._permutations:
            self._permutations[epoch] = np.random.default_rng([self.seed, epoch]).permutation(size)
        return int(self._permutations[epoch][offset])

    def length(self, sample_id: int) -> int:
        return self.dataset.length(self._index(sample_id))

    def __getitem__(self, sample_id: int) -> Sample:
        return self.dataset[self._index(sample_id)]
