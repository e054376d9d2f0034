"""Tokenizers: a built-in byte-level tokenizer and a Hugging Face tokenizer read from a local path."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

__all__ = ["Tokenizer", "ByteLevelTokenizer", "HuggingFaceTokenizer", "build_tokenizer",
           "TOKENIZER_TYPES"]

TOKENIZER_TYPES = ("ByteLevelTokenizer", "HuggingFaceTokenizer")


class Tokenizer(Protocol):
    vocab_size: int
    eod: int
    pad: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...


@dataclass(kw_only=True)
class ByteLevelTokenizer:
    """UTF-8 bytes are tokens 0..255; 256 is end-of-document, 257 is padding."""

    vocab_size: int = 258
    """Number of token ids (256 bytes + end-of-document + padding)."""

    def __post_init__(self) -> None:
        if self.vocab_size != 258:
            raise ValueError("ByteLevelTokenizer has exactly 258 tokens; do not set vocab_size")

    @property
    def eod(self) -> int:
        return 256

    @property
    def pad(self) -> int:
        return 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, token_ids: list[int]) -> str:
        return bytes(t for t in token_ids if t < 256).decode("utf-8", errors="replace")


class HuggingFaceTokenizer:
    """A tokenizer loaded from a local directory or ``tokenizer.json`` (never downloads).

    Uses ``transformers.AutoTokenizer`` when installed, else the ``tokenizers`` library.
    """

    def __init__(self, path: str) -> None:
        if not path or not os.path.exists(path):
            raise ValueError(f"--tokenizer-model {path!r} does not exist: give a local "
                             "directory (or tokenizer.json) of a Hugging Face tokenizer")
        self._encode, self._decode, vocab, eod = _load_hf(path)
        self.vocab_size = int(vocab)
        self.eod = int(eod)
        self.pad = self.eod

    def encode(self, text: str) -> list[int]:
        return list(self._encode(text))

    def decode(self, token_ids: list[int]) -> str:
        return self._decode(list(token_ids))


def _load_hf(path: str):
    try:
        from transformers import AutoTokenizer  # type: ignore
    except ImportError:
        AutoTokenizer = None
    if AutoTokenizer is not None:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        eod = tok.eos_token_id if tok.eos_token_id is not None else len(tok) - 1
        return (lambda s: tok.encode(s, add_special_tokens=False), tok.decode, len(tok), eod)
    try:
        from tokenizers import Tokenizer as RawTokenizer  # type: ignore
    except ImportError as exc:
        raise ValueError("--tokenizer-type HuggingFaceTokenizer needs `transformers` or "
                         "`tokenizers` (pip install tokenizers), or use "
                         "--tokenizer-type ByteLevelTokenizer") from exc
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise ValueError(f"no tokenizer.json in {path!r} (needed without `transformers`)")
    tok = RawTokenizer.from_file(file)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    eod = next((tok.token_to_id(name) for name in ("</s>", "<|endoftext|>", "<eos>", "<|eot_id|>")
                if tok.token_to_id(name) is not None), vocab - 1)
    return (lambda s: tok.encode(s, add_special_tokens=False).ids, tok.decode, vocab, eod)


def build_tokenizer(tokenizer_type: str, tokenizer_model: str | None = None) -> Tokenizer:
    """The tokenizer named by ``--tokenizer-type`` (and ``--tokenizer-model``)."""
    if tokenizer_type == "ByteLevelTokenizer":
        return ByteLevelTokenizer()
    if tokenizer_type == "HuggingFaceTokenizer":
        return HuggingFaceTokenizer(tokenizer_model or "")
    raise ValueError(f"--tokenizer-type {tokenizer_type!r} is not one of {TOKENIZER_TYPES}")
