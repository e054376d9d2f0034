"""Which tokenizer a run uses, whether it belongs to the model, and its fingerprint.

* :func:`default_tokenizer_model`: with ``--hf-checkpoint DIR`` and no tokenizer flag the
  tokenizer is DIR's own (as TRL and verl take it from the model path); a DIR without
  tokenizer files is an error unless the data needs none (``--mock-data``) or the
  built-in byte-level tokenizer is asked for (``--tokenizer-type ByteLevelTokenizer``).
* :func:`tokenizer_mismatches`: a tokenizer whose ids do not fit the model's embedding,
  or (a Hugging Face tokenizer for a Hugging Face model) whose eos / pad ids differ from
  the model config's.
* :func:`tokenizer_record`: what a checkpoint records about the tokenizer used, with a
  SHA-256 of its files (:func:`tokenizer_sha256`), which ``tools/export_hf.py`` checks
  before it ships the tokenizer with the weights.
"""

from __future__ import annotations

import hashlib
import os

__all__ = ["TOKENIZER_FILES", "TOKENIZER_MARKERS", "CHAT_TEMPLATES_DIR", "has_tokenizer",
           "tokenizer_paths", "tokenizer_sha256", "default_tokenizer_model",
           "tokenizer_mismatches", "tokenizer_record", "describe_tokenizer"]

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json")
"""The files of a Hugging Face tokenizer directory (what it encodes and renders with)."""
TOKENIZER_MARKERS = ("tokenizer.json", "tokenizer.model", "vocab.json")
"""One of them makes a directory hold a tokenizer."""
CHAT_TEMPLATES_DIR = "additional_chat_templates"
"""transformers' folder of named chat templates."""


def has_tokenizer(directory: str) -> bool:
    """``directory`` holds a Hugging Face tokenizer (one of :data:`TOKENIZER_MARKERS`)."""
    return any(os.path.isfile(os.path.join(directory, name)) for name in TOKENIZER_MARKERS)


def tokenizer_paths(path: str) -> list[str]:
    """The files that make up the tokenizer at ``path``: a directory's
    :data:`TOKENIZER_FILES` and named chat templates, or the one file."""
    if os.path.isfile(path):
        return [path]
    files = [os.path.join(path, name) for name in TOKENIZER_FILES
             if os.path.isfile(os.path.join(path, name))]
    templates = os.path.join(path, CHAT_TEMPLATES_DIR)
    if os.path.isdir(templates):
        files += [os.path.join(templates, name) for name in sorted(os.listdir(templates))
                  if os.path.isfile(os.path.join(templates, name))]
    return files


def tokenizer_sha256(paths: list[str], root: str | None = None) -> str:
    """SHA-256 over the names (relative to ``root``, else base names) and contents of
    ``paths``: equal exactly when the same files hold the same bytes."""
    digest = hashlib.sha256()
    for path in sorted(paths, key=lambda p: os.path.relpath(p, root) if root else
                       os.path.basename(p)):
        name = os.path.relpath(path, root) if root else os.path.basename(path)
        digest.update(name.encode("utf-8") + b"\0")
        with open(path, "rb") as handle:
            content = handle.read()
        digest.update(len(content).to_bytes(8, "little") + content)
    return digest.hexdigest()


def default_tokenizer_model(tokenizer_type: str | None, tokenizer_model: str | None, *,
                            vocab_file: str | None, merge_file: str | None,
                            hf_checkpoint: str | None, mock_data: bool) -> str | None:
    """``--tokenizer-model`` as the flags mean it: with ``--hf-checkpoint DIR`` and no
    tokenizer flag (or ``--tokenizer-type HuggingFaceTokenizer`` alone), DIR when it holds
    a tokenizer. ValueError when DIR holds none and the data needs one (never a silent
    byte-level tokenizer)."""
    hf_type_alone = tokenizer_type == "HuggingFaceTokenizer" and not tokenizer_model
    chosen = (tokenizer_type and not hf_type_alone) or tokenizer_model or vocab_file or \
        merge_file
    if not hf_checkpoint or chosen or mock_data:
        return tokenizer_model
    if os.path.isdir(hf_checkpoint) and has_tokenizer(hf_checkpoint):
        return hf_checkpoint
    raise ValueError(f"--hf-checkpoint {hf_checkpoint} holds no tokenizer (none of "
                     f"{', '.join(TOKENIZER_MARKERS)}): give the model's tokenizer with "
                     f"--tokenizer-model PATH, or --tokenizer-type ByteLevelTokenizer to "
                     f"train it on the built-in byte-level tokenizer deliberately")


def _ids(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def tokenizer_mismatches(tokenizer, *, vocab_size: int, hf_config: dict | None) -> list[str]:
    """What makes ``tokenizer`` not the model's: an end-of-document or padding id outside
    the embedding's ``vocab_size`` rows; for a Hugging Face tokenizer and a model read
    from a Hugging Face config, an eos id not among the config's ``eos_token_id`` or a
    pad id other than its ``pad_token_id`` (when both define one)."""
    problems = [f"its {name} id {value} is outside the model's {vocab_size} embedding rows"
                for name, value in (("end-of-document", tokenizer.eod),
                                    ("padding", tokenizer.pad))
                if not 0 <= int(value) < vocab_size]
    special = getattr(tokenizer, "special_ids", None)
    if hf_config is None or special is None:
        return problems
    eos = _ids(hf_config.get("eos_token_id"))
    if eos and special.get("eos") is None:
        problems.append(f"it has no eos token; the model's config has eos_token_id "
                        f"{hf_config['eos_token_id']}")
    elif eos and int(special["eos"]) not in eos:
        problems.append(f"its eos id {special['eos']} is not the model config's eos_token_id "
                        f"{hf_config['eos_token_id']}")
    pad = _ids(hf_config.get("pad_token_id"))
    if pad and special.get("pad") is not None and int(special["pad"]) not in pad:
        problems.append(f"its pad id {special['pad']} is not the model config's pad_token_id "
                        f"{hf_config['pad_token_id']}")
    return problems


def tokenizer_record(tokenizer_type: str, tokenizer_model: str | None, *,
                     vocab_file: str | None = None, merge_file: str | None = None) -> dict:
    """What a checkpoint records about the tokenizer a run used: its type, its directory
    (a Hugging Face tokenizer directory; else None) and the SHA-256 of its files (None
    for the built-in byte-level tokenizer)."""
    if tokenizer_type == "HuggingFaceTokenizer" and tokenizer_model:
        root = tokenizer_model if os.path.isdir(tokenizer_model) else None
        return {"tokenizer_type": tokenizer_type,
                "tokenizer_dir": os.path.abspath(root) if root else None,
                "tokenizer_sha256": tokenizer_sha256(tokenizer_paths(tokenizer_model), root)}
    files = [path for path in (vocab_file, merge_file) if path]
    return {"tokenizer_type": tokenizer_type, "tokenizer_dir": None,
            "tokenizer_sha256": tokenizer_sha256(files) if files else None}


def describe_tokenizer(tokenizer_type: str, tokenizer_model: str | None, tokenizer, *,
                       hf_checkpoint: str | None = None) -> str:
    """One log line: the tokenizer, where it came from, its vocabulary and special ids."""
    where = ""
    if tokenizer_model:
        own = hf_checkpoint and os.path.abspath(tokenizer_model) == os.path.abspath(
            hf_checkpoint)
        where = f" {tokenizer_model}" + (" (the --hf-checkpoint's own)" if own else "")
    return (f"tokenizer: {tokenizer_type}{where}, vocabulary {tokenizer.vocab_size} tokens, "
            f"end-of-document id {tokenizer.eod}, padding id {tokenizer.pad}")
