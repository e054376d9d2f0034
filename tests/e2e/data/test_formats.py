"""JSONL formats: chat through a Hugging Face tokenizer's own chat template (loss on
assistant tokens only, the mask checked token by token), pre-tokenized records, and bad
input named by file and line."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from odc_pp.data import ByteLevelTokenizer, HuggingFaceTokenizer, JsonlDataset, encode_document

from tests.unit.data.tiny_hf import (CHATML_MARKERS, CHATML_PLAIN, DATED, DROPS_OLD_REPLIES, USER_FIRST,
                      byte_bpe_tokenizer, word_level_tokenizer)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

CONVERSATION = [{"role": "user", "content": "hello there"},
                {"role": "assistant", "content": "fine thanks"},
                {"role": "user", "content": "how are you"},
                {"role": "assistant", "content": "fine"}]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokenizers")
    made = {name: HuggingFaceTokenizer(word_level_tokenizer(root / name, template))
            for name, template in [("markers", CHATML_MARKERS), ("plain", CHATML_PLAIN),
                                   ("drops", DROPS_OLD_REPLIES), ("user_first", USER_FIRST),
                                   ("none", None)]}
    made["bpe"] = HuggingFaceTokenizer(byte_bpe_tokenizer(root / "bpe", CHATML_PLAIN))
    made["dated"] = HuggingFaceTokenizer(byte_bpe_tokenizer(root / "dated", DATED))
    return made


def words(tokenizer, ids):
    return [tokenizer.decode([i]) for i in ids]


@pytest.mark.parametrize("name", ["markers", "plain"])
def test_chat_template_loss_mask_is_exactly_the_assistant_replies(tokenizers, name):
    tok = tokenizers[name]
    sample = encode_document({"messages": CONVERSATION}, tok, seq_length=64)
    prompt = [] if name == "markers" else ["<|im_start|>", "system", "a", "b", "<|im_end|>"]
    expected = prompt + [
        "<|im_start|>", "user", "hello", "there", "<|im_end|>",
        "<|im_start|>", "assistant", "fine", "thanks", "<|im_end|>",
        "<|im_start|>", "user", "how", "are", "you", "<|im_end|>",
        "<|im_start|>", "assistant", "fine", "<|im_end|>"]
    assert words(tok, sample.tokens) == expected
    # loss_mask[i] weighs the prediction of tokens[i + 1]: exactly the replies and their end
    scored = {len(prompt) + i for i in (7, 8, 9, 18, 19)}
    assert sample.loss_mask.tolist() == [float(i in scored) for i in range(1, len(expected))]
    assert sample.loss_mask.dtype == np.float32


def test_chat_mask_survives_bpe_merges_across_the_header(tokenizers):
    tok = tokenizers["bpe"]
    sample = encode_document({"messages": CONVERSATION[:2]}, tok, seq_length=64)
    text = tok.decode(sample.tokens.tolist())
    assert text == ("<|im_start|>system\na b<|im_end|>\n<|im_start|>user\nhello there"
                    "<|im_end|>\n<|im_start|>assistant\nfine thanks<|im_end|>\n")
    scored = [int(t) for t, m in zip(sample.tokens[1:], sample.loss_mask) if m]
    # the reply, its end token and the template's newline after it; no header token
    assert tok.decode(scored) == "fine thanks<|im_end|>\n"
    first = int(np.flatnonzero(sample.loss_mask)[0]) + 1
    assert tok.decode(sample.tokens[:first].tolist()).endswith("<|im_start|>assistant\n")
    assert np.flatnonzero(sample.loss_mask).tolist() == \
        list(range(first - 1, len(sample.loss_mask)))


def test_chat_template_dates_do_not_follow_the_clock(tokenizers):
    tok = tokenizers["dated"]
    sample = encode_document({"messages": CONVERSATION[:2]}, tok, seq_length=64)
    text = tok.decode(sample.tokens.tolist())
    assert text.startswith("<|im_start|>system\n26 Jul 2024<|im_end|>")
    scored = [int(t) for t, m in zip(sample.tokens[1:], sample.loss_mask) if m]
    assert tok.decode(scored) == "fine thanks<|im_end|>\n"


def test_chat_truncation_keeps_the_mask_aligned(tokenizers):
    tok = tokenizers["markers"]
    full = encode_document({"messages": CONVERSATION}, tok, seq_length=64)
    cut = encode_document({"messages": CONVERSATION}, tok, seq_length=8)
    assert cut.tokens.tolist() == full.tokens[:9].tolist()
    assert cut.loss_mask.tolist() == full.loss_mask[:8].tolist()


def test_chat_template_problems_are_errors_naming_file_and_line(tmp_path, tokenizers):
    path = tmp_path / "chat.jsonl"
    ok = json.dumps({"messages": CONVERSATION[:2]})
    path.write_text(ok + "\n" + json.dumps({"messages": CONVERSATION}) + "\n")
    with pytest.raises(ValueError, match=r"chat.jsonl:2: .*messages\[1\] differently .* "
                                         r"not prefix-stable"):
        JsonlDataset([str(path)], tokenizers["drops"], seq_length=64)
    path.write_text(ok + "\n" + json.dumps({"messages": CONVERSATION[1:]}) + "\n")
    with pytest.raises(ValueError, match="chat.jsonl:2: the chat template failed: .*"
                                         "conversations start with the user"):
        JsonlDataset([str(path)], tokenizers["user_first"], seq_length=64)
    with pytest.raises(ValueError, match=r"chat.jsonl:2: messages\[0\] is an assistant turn "
                                         r"and the chat template cannot render the empty "
                                         r"prompt before it"):
        JsonlDataset([str(path)], tokenizers["plain"], seq_length=64)
    with pytest.raises(ValueError, match="chat.jsonl:1: --tokenizer-model .*none has no "
                                         "chat_template"):
        JsonlDataset([str(path)], tokenizers["none"], seq_length=64)
    path.write_text(ok + "\n" + json.dumps({"messages": [{"role": "user", "content": 3}]}))
    with pytest.raises(ValueError, match=r"chat.jsonl:2: messages\[0\].content must be a "
                                         r"string, got a JSON number"):
        JsonlDataset([str(path)], tokenizers["markers"], seq_length=64)


def test_pretokenized_records(tmp_path):
    path = tmp_path / "ids.jsonl"
    path.write_text(json.dumps({"input_ids": [5, 6, 7, 8]}) + "\n" +
                    json.dumps({"input_ids": [1, 2, 3], "loss_mask": [0, 1]}) + "\n" +
                    json.dumps({"input_ids": [9, 9], "loss_mask": [True]}) + "\n")
    data = JsonlDataset([str(path)], ByteLevelTokenizer(), seq_length=64)
    assert [s.tokens.tolist() for s in data.samples] == [[5, 6, 7, 8], [1, 2, 3], [9, 9]]
    assert [s.loss_mask.tolist() for s in data.samples] == [[1, 1, 1], [0, 1], [1]]
    assert [s.length for s in data.samples] == [3, 2, 1]  # L ids: L - 1 predictions
    short = encode_document({"input_ids": list(range(10)), "loss_mask": [1] * 9},
                            ByteLevelTokenizer(), seq_length=4)
    assert short.tokens.tolist() == [0, 1, 2, 3, 4] and short.loss_mask.tolist() == [1] * 4


@pytest.mark.parametrize("record, message", [
    ({"input_ids": [1]}, r"'input_ids' must be a list of at least 2 token ids, got 1 ids"),
    ({"input_ids": "1 2"}, r"'input_ids' must be a list .* got a JSON string"),
    ({"input_ids": [1, 258]}, r"input_ids\[1\] = 258 is not a token id in \[0, 258\)"),
    ({"input_ids": [1, -1]}, r"input_ids\[1\] = -1 is not a token id"),
    ({"input_ids": [1, 2.0]}, r"input_ids\[1\] = 2.0 is not a token id"),
    ({"input_ids": [True, 2]}, r"input_ids\[0\] = true is not a token id"),
    ({"input_ids": [1, 2, 3], "loss_mask": [1, 1, 1]},
     r"'loss_mask' must have len\(input_ids\) - 1 = 2 entries .* got 3 entries"),
    ({"input_ids": [1, 2, 3], "loss_mask": [1, 0.5]}, r"loss_mask\[1\] = 0.5 must be 0 or 1"),
    ({"input_ids": [1, 2, 3], "loss_mask": [0, 0]}, r"'loss_mask' is all 0"),
    ({"input_ids": [1, 2], "labels": [2]},
     r"a pre-tokenized record has only 'input_ids' and 'loss_mask', got also \['labels'\]"),
    ({"input_ids": [1, 2], "text": "x"},
     r"a JSONL record needs exactly one of .* got \['text', 'input_ids'\]"),
], ids=["one-id", "not-list", "too-big", "negative", "float", "bool", "mask-length",
        "mask-value", "mask-zero", "extra-key", "two-formats"])
def test_bad_pretokenized_record_names_file_and_line(tmp_path, record, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"input_ids": [1, 2]}) + "\n\n" + json.dumps(record) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl:3: " + message):
        JsonlDataset([str(path)], ByteLevelTokenizer(), seq_length=16)


def test_frontend_exits_2_naming_the_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"input_ids": [1, 2, 3]}) + "\n" +
                    json.dumps({"input_ids": [1, 2, 3], "loss_mask": [1]}) + "\n")
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, os.path.join(ROOT, "pretrain_gpt.py"),
                          "--num-layers", "2", "--hidden-size", "16",
                          "--num-attention-heads", "2", "--seq-length", "16",
                          "--global-batch-size", "2", "--train-iters", "1",
                          "--data-path", str(path), "--no-progress-bar"],
                         capture_output=True, text=True, timeout=180, env=env)
    assert run.returncode == 2, run.stderr[-3000:]
    assert f"{path}:2: 'loss_mask' must have len(input_ids) - 1 = 2 entries" in run.stderr
