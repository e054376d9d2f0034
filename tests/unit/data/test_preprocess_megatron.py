"""tools/preprocess_data.py is Megatron-LM's tool (issue 51, item 3): it takes Megatron-LM's
invocation (``--input --output-prefix --tokenizer-type --vocab-file --merge-file
--tokenizer-model --append-eod --json-keys --workers``) and writes
``{prefix}_{key}_document.bin/.idx`` byte for byte as Megatron-LM's tool does: the
reference here is Megatron-LM's encoding (one document per line, a sentence per string,
empty sentences dropped, EOD only with ``--append-eod``) written by megatron-core's
``IndexedDatasetBuilder.add_document``, with the tokenizer tokenizing independently of
ours (transformers' slow GPT-2 tokenizer; megatron-core's own HuggingFaceTokenizer).
megatron-core's ``IndexedDataset`` reads the output. Tiny tokenizers made here."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from odc_pp.data.preprocess import main

from .tiny_hf import word_level_tokenizer

pytest.importorskip("transformers")

DOCUMENTS = [
    {"text": "hello there, how are you?", "title": "greeting"},
    {"text": ["fine thanks.", "", "  how are   you\n"], "title": "ünïcode é 😀"},
    {"text": "", "title": "empty text"},
    {"text": "thanks thanks thanks hello", "title": ""},
]
WORDS_DOCUMENTS = [{"text": "hello there how are you"}, {"text": ["fine thanks", "sure"]},
                   {"text": ""}, {"text": "the answer to your question"}]


def _jsonl(path, records) -> str:
    with open(path, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    return str(path)


def _gpt2_files(directory) -> tuple[str, str]:
    """A tiny GPT-2 byte-level BPE: vocab.json and merges.txt with <|endoftext|>."""
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(["hello there, how are you? fine thanks é ünïcode"] * 5,
                            vocab_size=300, special_tokens=["<|endoftext|>"])
    os.makedirs(directory, exist_ok=True)
    bpe.save_model(str(directory))
    return str(directory / "vocab.json"), str(directory / "merges.txt")


def _megatron_reference(path, prefix, keys, tokenize, eod, vocab_size, append_eod) -> None:
    """What Megatron-LM's preprocess_data.py writes: its Encoder.encode per line, then
    IndexedDatasetBuilder.add_document per key, finalize."""
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    builders = {key: IndexedDatasetBuilder(f"{prefix}_{key}_document.bin",
                                           dtype=DType.optimal_dtype(vocab_size))
                for key in keys}
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            record = json.loads(line)
            for key in keys:
                text = record[key]
                ids, lengths = [], []
                for sentence in text if isinstance(text, list) else [text]:
                    sentence_ids = tokenize(sentence)
                    if sentence_ids:
                        ids.extend(sentence_ids)
                        lengths.append(len(sentence_ids))
                if ids and append_eod:
                    ids.append(eod)
                    lengths[-1] += 1
                builders[key].add_document(ids, lengths)
    for key, builder in builders.items():
        builder.finalize(f"{prefix}_{key}_document.idx")


def _same_bytes(ours: str, reference: str) -> None:
    for suffix in (".bin", ".idx"):
        with open(ours + suffix, "rb") as a, open(reference + suffix, "rb") as b:
            assert a.read() == b.read(), f"{ours}{suffix} differs from Megatron-LM's"


@pytest.mark.parametrize("workers", [1, 2])
def test_megatron_gpt2_invocation_writes_megatrons_bytes(tmp_path, workers):
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    from transformers import GPT2Tokenizer

    vocab, merges = _gpt2_files(tmp_path / "gpt2")
    data = _jsonl(tmp_path / "data.jsonl", DOCUMENTS)
    prefix = str(tmp_path / "out" / "corpus")
    assert main(["--input", data, "--output-prefix", prefix, "--vocab-file", vocab,
                 "--merge-file", merges, "--tokenizer-type", "GPT2BPETokenizer",
                 "--append-eod", "--workers", str(workers), "--json-keys", "text",
                 "title"]) == 0
    slow = GPT2Tokenizer(vocab, merges)  # the Python BPE, not ours (the fast one)
    eod = slow.convert_tokens_to_ids("<|endoftext|>")
    _megatron_reference(data, str(tmp_path / "reference"), ["text", "title"], slow.encode,
                        eod, len(slow), append_eod=True)
    for key in ("text", "title"):
        _same_bytes(f"{prefix}_{key}_document", str(tmp_path / f"reference_{key}_document"))
    dataset = IndexedDataset(f"{prefix}_text_document")
    assert dataset.index.dtype == np.uint16
    assert len(dataset) == 4  # sequences: one, two (the empty sentence dropped), none, one
    assert dataset.document_indices.tolist() == [0, 1, 3, 3, 4]
    assert dataset[0].tolist() == slow.encode(DOCUMENTS[0]["text"]) + [eod]
    assert dataset[2].tolist() == slow.encode("  how are   you\n") + [eod]
    assert sorted(os.listdir(tmp_path / "out")) == sorted(
        f"corpus_{key}_document.{ext}" for key in ("text", "title") for ext in ("bin", "idx"))


def test_hugging_face_tokenizer_without_eod_is_megatrons(tmp_path):
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    from megatron.core.tokenizers import MegatronTokenizer

    model = word_level_tokenizer(tmp_path / "tok", None)
    data = _jsonl(tmp_path / "data.jsonl", WORDS_DOCUMENTS)
    prefix = str(tmp_path / "corpus")
    assert main(["--input", data, "--output-prefix", prefix, "--tokenizer-type",
                 "HuggingFaceTokenizer", "--tokenizer-model", model, "--workers", "1"]) == 0
    megatron = MegatronTokenizer.from_pretrained(tokenizer_path=model,
                                                 metadata_path={"library": "huggingface"})
    _megatron_reference(data, str(tmp_path / "reference"), ["text"], megatron.tokenize,
                        megatron.eod, megatron.vocab_size, append_eod=False)
    _same_bytes(f"{prefix}_text_document", str(tmp_path / "reference_text_document"))
    dataset = IndexedDataset(f"{prefix}_text_document")
    assert dataset[0].tolist() == megatron.tokenize("hello there how are you")  # no EOD
    assert dataset.document_indices.tolist() == [0, 1, 3, 3, 4]


def test_split_sentences_is_refused_with_the_reason(tmp_path, capsys):
    data = _jsonl(tmp_path / "data.jsonl", WORDS_DOCUMENTS)
    assert main(["--input", data, "--output-prefix", str(tmp_path / "out"),
                 "--split-sentences", "--workers", "1"]) == 2
    error = capsys.readouterr().err
    assert "--split-sentences is not supported" in error and "nltk" in error
    assert "list of sentences" in error
    assert not list(tmp_path.glob("out*"))


def test_gpt2_without_its_files_names_the_missing_flag(tmp_path, capsys):
    data = _jsonl(tmp_path / "data.jsonl", WORDS_DOCUMENTS)
    assert main(["--input", data, "--output-prefix", str(tmp_path / "out"),
                 "--tokenizer-type", "GPT2BPETokenizer", "--workers", "1"]) == 2
    assert "needs --vocab-file and --merge-file" in capsys.readouterr().err


@pytest.mark.parametrize("line, message", [
    ('{"title": "x"}', r"data.jsonl:2: no key 'text' \(--json-keys text\)"),
    ('{"text": ["a", 3]}', r"data.jsonl:2: 'text'\[1\] must be a JSON string"),
    ('{"text": 3}', r"data.jsonl:2: 'text' must be a JSON string, got a JSON number"),
    ('{oops', r"data.jsonl:2: not valid JSON"),
])
def test_a_bad_line_names_file_and_line_and_writes_nothing(tmp_path, capsys, line, message):
    import re

    data = tmp_path / "data.jsonl"
    data.write_text('{"text": "fine"}\n' + line + "\n")
    assert main(["--input", str(data), "--output-prefix", str(tmp_path / "out" / "c"),
                 "--workers", "1"]) == 2
    assert re.search(message, capsys.readouterr().err)
    assert os.listdir(tmp_path / "out") == []
