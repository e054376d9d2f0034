"""Tokenizers: a built-in byte-level tokenizer and a Hugging Face tokenizer read from a local path."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

from .chat import encode_role_headers, encode_with_template

__all__ = ["Tokenizer", "ByteLevelTokenizer", "HuggingFaceTokenizer", "GPT2BPETokenizer",
           "build_tokenizer", "TOKENIZER_TYPES", "tokenizer_type_for"]

TOKENIZER_TYPES = ("ByteLevelTokenizer", "HuggingFaceTokenizer", "GPT2BPETokenizer")


class Tokenizer(Protocol):
    vocab_size: int
    eod: int
    pad: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...

    def encode_chat(self, messages: list[dict]) -> tuple[list[int], list[int]]:
        """Token ids of a conversation and a 0/1 flag per id: 1 where the assistant wrote
        it (:mod:`odc_pp.data.chat`)."""


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

    def encode_chat(self, messages: list[dict]) -> tuple[list[int], list[int]]:
        """The built-in ``<|role|>\\n`` format (:func:`~odc_pp.data.chat.encode_role_headers`)."""
        return encode_role_headers(messages, self.encode, self.eod)


class HuggingFaceTokenizer:
    """A tokenizer loaded from a local directory or ``tokenizer.json`` (never downloads).

    Uses ``transformers.AutoTokenizer`` when installed, else the ``tokenizers`` library.
    Conversations go through the tokenizer's own chat template (needs ``transformers``).
    """

    def __init__(self, path: str) -> None:
        if not path or not os.path.exists(path):
            raise ValueError(f"--tokenizer-model {path!r} does not exist: give a local "
                             "directory (or tokenizer.json) of a Hugging Face tokenizer")
        self.path = path
        self._tokenizer, self._raw = _load_hf(path)
        if self._tokenizer is not None:
            tok = self._tokenizer
            self.vocab_size = len(tok)
            self.eod = tok.eos_token_id if tok.eos_token_id is not None else len(tok) - 1
            self.special_ids: dict | None = {"eos": tok.eos_token_id,
                                             "pad": tok.pad_token_id}
            """The tokenizer's own eos / pad ids (None: it defines none), compared with
            the model config's (:mod:`odc_pp.data.tokenizer_identity`)."""
        else:
            self.special_ids = None
            self.vocab_size = self._raw.get_vocab_size(with_added_tokens=True)
            self.eod = next((self._raw.token_to_id(name)
                             for name in ("</s>", "<|endoftext|>", "<eos>", "<|eot_id|>")
                             if self._raw.token_to_id(name) is not None), self.vocab_size - 1)
        self.pad = self.eod

    def encode(self, text: str) -> list[int]:
        if self._tokenizer is not None:
            return list(self._tokenizer.encode(text, add_special_tokens=False))
        return list(self._raw.encode(text, add_special_tokens=False).ids)

    def decode(self, token_ids: list[int]) -> str:
        source = self._tokenizer if self._tokenizer is not None else self._raw
        return source.decode(list(token_ids))

    def encode_chat(self, messages: list[dict]) -> tuple[list[int], list[int]]:
        """``messages`` through the tokenizer's chat template
        (:func:`~odc_pp.data.chat.encode_with_template`)."""
        if self._tokenizer is None:
            raise ValueError("'messages' records need `transformers` (pip install "
                             "transformers) to apply the chat template of --tokenizer-model "
                             f"{self.path}")
        if not getattr(self._tokenizer, "chat_template", None):
            raise ValueError(f"--tokenizer-model {self.path} has no chat_template, so "
                             f"'messages' records cannot be rendered; give a tokenizer with a "
                             f"chat template or pre-tokenize the data ('input_ids' records)")
        return encode_with_template(self._tokenizer, messages)


class GPT2BPETokenizer:
    """Megatron's GPT2BPETokenizer: the GPT-2 byte-level BPE of ``--vocab-file``
    (vocab.json) and ``--merge-file`` (merges.txt), through transformers'
    ``GPT2TokenizerFast``; end-of-document (and padding) is ``<|endoftext|>``."""

    def __init__(self, vocab_file: str | None, merge_file: str | None) -> None:
        for flag, path in (("--vocab-file", vocab_file), ("--merge-file", merge_file)):
            if not path:
                raise ValueError(f"--tokenizer-type GPT2BPETokenizer needs {flag} (GPT-2's "
                                 f"vocab.json and merges.txt, as Megatron's)")
            if not os.path.isfile(path):
                raise ValueError(f"{flag} {path!r}: no such file")
        try:
            from transformers import GPT2TokenizerFast  # type: ignore
        except ImportError as exc:
            raise ValueError("--vocab-file/--merge-file need `transformers` (pip install "
                             "transformers) to build the GPT-2 BPE tokenizer") from exc
        try:
            self._tokenizer = GPT2TokenizerFast(vocab_file=vocab_file, merges_file=merge_file)
        except Exception as exc:  # a malformed vocab.json / merges.txt
            raise ValueError(f"--vocab-file {vocab_file} / --merge-file {merge_file}: not a "
                             f"GPT-2 BPE vocabulary ({type(exc).__name__}: {exc})") from exc
        self.vocab_size = len(self._tokenizer)
        eod = self._tokenizer.convert_tokens_to_ids("<|endoftext|>")
        if eod is None:
            raise ValueError(f"--vocab-file {vocab_file} has no <|endoftext|> token")
        self.eod = self.pad = int(eod)

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def decode(self, token_ids: list[int]) -> str:
        return self._tokenizer.decode(list(token_ids))

    def encode_chat(self, messages: list[dict]) -> tuple[list[int], list[int]]:
        """The built-in ``<|role|>\\n`` format (GPT-2 has no chat template)."""
        return encode_role_headers(messages, self.encode, self.eod)


def _load_hf(path: str):
    """(transformers tokenizer, None) when ``transformers`` is installed, else
    (None, ``tokenizers.Tokenizer``)."""
    try:
        from transformers import AutoTokenizer  # type: ignore
    except ImportError:
        AutoTokenizer = None
    if AutoTokenizer is not None:
        return AutoTokenizer.from_pretrained(path, local_files_only=True), None
    try:
        from tokenizers import Tokenizer as RawTokenizer  # type: ignore
    except ImportError as exc:
        raise ValueError("--tokenizer-type HuggingFaceTokenizer needs `transformers` or "
                         "`tokenizers` (pip install tokenizers), or use "
                         "--tokenizer-type ByteLevelTokenizer") from exc
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise ValueError(f"no tokenizer.json in {path!r} (needed without `transformers`)")
    return None, RawTokenizer.from_file(file)


def tokenizer_type_for(tokenizer_type: str | None, tokenizer_model: str | None, *,
                       vocab_file: str | None = None, merge_file: str | None = None) -> str:
    """The tokenizer type the flags mean: ``--tokenizer-model`` alone means
    HuggingFaceTokenizer, ``--vocab-file``/``--merge-file`` GPT2BPETokenizer (Megatron's
    GPT-2 BPE), nothing ByteLevelTokenizer. ValueError (naming the flag) for a file that
    does not exist, one that the type would ignore, or GPT2BPETokenizer without both
    files."""
    if tokenizer_model is not None and not os.path.exists(tokenizer_model):
        raise ValueError(f"--tokenizer-model {tokenizer_model!r} does not exist: give a local "
                         f"directory (or tokenizer.json) of a Hugging Face tokenizer")
    bpe = _bpe_type(tokenizer_type, tokenizer_model, vocab_file, merge_file)
    if bpe:
        return bpe
    if tokenizer_type is None:
        return "HuggingFaceTokenizer" if tokenizer_model else "ByteLevelTokenizer"
    if tokenizer_type == "ByteLevelTokenizer" and tokenizer_model:
        raise ValueError(f"--tokenizer-type ByteLevelTokenizer takes no --tokenizer-model "
                         f"(got {tokenizer_model!r}); drop one of them, or use "
                         f"--tokenizer-type HuggingFaceTokenizer")
    return tokenizer_type


def _bpe_type(tokenizer_type: str | None, tokenizer_model: str | None,
              vocab_file: str | None, merge_file: str | None) -> str | None:
    """"GPT2BPETokenizer" when the flags mean it (checked), else None."""
    files = [(flag, path) for flag, path in (("--vocab-file", vocab_file),
                                             ("--merge-file", merge_file)) if path]
    if tokenizer_type != "GPT2BPETokenizer" and not files:
        return None
    if tokenizer_type not in (None, "GPT2BPETokenizer"):
        raise ValueError(f"{' and '.join(f for f, _ in files)} belong to --tokenizer-type "
                         f"GPT2BPETokenizer, not {tokenizer_type}; drop them or change the type")
    if tokenizer_model:
        raise ValueError(f"--tokenizer-model {tokenizer_model!r} and --vocab-file/--merge-file "
                         f"name two tokenizers; give one")
    missing = [flag for flag, path in (("--vocab-file", vocab_file),
                                       ("--merge-file", merge_file)) if not path]
    if missing:
        raise ValueError(f"the GPT-2 BPE tokenizer (--tokenizer-type GPT2BPETokenizer) needs "
                         f"{' and '.join(missing)} (vocab.json and merges.txt)")
    for flag, path in files:
        if not os.path.isfile(path):
            raise ValueError(f"{flag} {path!r}: no such file")
    return "GPT2BPETokenizer"


def build_tokenizer(tokenizer_type: str, tokenizer_model: str | None = None, *,
                    vocab_file: str | None = None, merge_file: str | None = None) -> Tokenizer:
    """The tokenizer named by ``--tokenizer-type`` (and ``--tokenizer-model``, or
    ``--vocab-file`` / ``--merge-file``)."""
    if tokenizer_type == "GPT2BPETokenizer":
        return GPT2BPETokenizer(vocab_file, merge_file)
    if tokenizer_type == "ByteLevelTokenizer":
        return ByteLevelTokenizer()
    if tokenizer_type == "HuggingFaceTokenizer":
        return HuggingFaceTokenizer(tokenizer_model or "")
    raise ValueError(f"--tokenizer-type {tokenizer_type!r} is not one of {TOKENIZER_TYPES}")
