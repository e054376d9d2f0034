"""Data is what it says: a JSONL ``text`` that is not a string is an error naming
file:line (training, ``--valid-data-path`` and tools/preprocess_data.py share the
encoder), and indexed datasets check every token id against the model's vocabulary when
they are opened, naming the file, document, position and id."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from odc_pp.data import ByteLevelTokenizer, IndexedTokenDataset, JsonlDataset
from odc_pp.data.preprocess import preprocess_jsonl

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))


@pytest.mark.parametrize("value, kind", [("null", "null"), ("3", "number"),
                                          ('["a", "b"]', "array"), ('{"a": 1}', "object"),
                                          ("true", "boolean")])
def test_a_text_that_is_not_a_string_names_file_and_line(tmp_path, value, kind):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n\n{"text": ' + value + '}\n')
    message = f"bad.jsonl:3: 'text' must be a JSON string, got a JSON {kind}"
    with pytest.raises(ValueError, match=message):
        JsonlDataset([str(bad)], ByteLevelTokenizer(), seq_length=16)
    with pytest.raises(ValueError, match=message):
        preprocess_jsonl([str(bad)], str(tmp_path / "out"), tokenizer_type="ByteLevelTokenizer")


def test_preprocess_data_exits_2_on_a_null_text(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": null}\n')
    done = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "preprocess_data.py"),
                           "--input", str(bad), "--output-prefix", str(tmp_path / "out"),
                           "--tokenizer-type", "ByteLevelTokenizer"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "bad.jsonl:1: 'text' must be a JSON string, got a JSON null" in done.stderr
    assert not os.path.exists(tmp_path / "out_text_document.idx")  # nothing written


def _indexed(tmp_path, documents, dtype=np.int32) -> str:
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    prefix = str(tmp_path / "corpus")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for document in documents:
        builder.add_item(torch.tensor(document, dtype=torch.int64))
        builder.end_document()
    builder.finalize(prefix + ".idx")
    return prefix


def test_an_out_of_vocabulary_id_names_file_document_and_position(tmp_path):
    prefix = _indexed(tmp_path, [[1, 2, 3], [4, 5], [6, 7, 99, 8, 100], [1, 2]])
    # 99 < 100: only id 100 (document 2, position 4) is outside a vocabulary of 100
    with pytest.raises(ValueError, match="document 2, position 4: token id 100 "):
        IndexedTokenDataset([prefix], seq_length=8, pad_id=0, vocab_size=100)
    assert len(IndexedTokenDataset([prefix], seq_length=8, pad_id=0, vocab_size=101)) == 4
    with pytest.raises(ValueError) as caught:
        IndexedTokenDataset([prefix], seq_length=8, pad_id=0, vocab_size=64)
    message = str(caught.value)
    assert f"{prefix}.bin: document 2, position 2: token id 99" in message, message
    assert "[0, 64)" in message and "--vocab-size" in message


def test_a_negative_id_in_a_signed_bin_is_named(tmp_path):
    prefix = _indexed(tmp_path, [[1, 2], [3, -1, 4]], dtype=np.int32)
    with pytest.raises(ValueError, match=r"corpus.bin: document 1, position 1: token id -1 "):
        IndexedTokenDataset([prefix], seq_length=8, pad_id=0, vocab_size=64)


def test_the_check_is_vectorised_in_blocks(monkeypatch):
    from odc_pp.data import token_check
    from odc_pp.data.token_check import first_bad_token

    monkeypatch.setattr(token_check, "BLOCK_TOKENS", 7)
    tokens = np.arange(50, dtype=np.int64) % 40
    tokens[33] = 40
    assert first_bad_token(tokens, 40) == 33
    assert first_bad_token(tokens, 41) is None
    # a dtype that cannot hold a bad id is not scanned
    assert first_bad_token(np.full(10, 65535, dtype=np.uint16), 65536) is None
    assert first_bad_token(np.full(10, 65535, dtype=np.uint16), 65535) == 0


def test_pretrain_gpt_exits_2_naming_the_bad_id(tmp_path):
    """Before the check the run trained until the sample reached the embedding, then
    failed with an IndexError naming nothing."""
    good = [list(range(1, 40))] * 5
    prefix = _indexed(tmp_path, good + [[5] * 10 + [5000] + [6] * 20] + good,
                      dtype=np.uint16)
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, os.path.join(ROOT, "pretrain_gpt.py"),
                          "--num-layers", "2", "--hidden-size", "16",
                          "--num-attention-heads", "2", "--seq-length", "16",
                          "--global-batch-size", "2", "--train-iters", "8",
                          "--tokenizer-type", "ByteLevelTokenizer",
                          "--data-path", prefix, "--no-progress-bar"],
                         capture_output=True, text=True, timeout=180, env=env)
    assert run.returncode == 2, run.stderr[-3000:]
    assert f"{prefix}.bin: document 5, position 10: token id 5000 is outside the model's " \
           f"vocabulary [0, 264)" in run.stderr, run.stderr[-3000:]
