import json

import numpy as np
import pytest

from odc_pp.data import (ByteLevelTokenizer, IndexedTokenDataset, JsonlDataset, Sample,
                         ShuffledSource, SyntheticCorpus, build_tokenizer, collate,
                         encode_document, split_by_tokens, split_fixed)
from odc_pp.data.preprocess import preprocess_jsonl


def test_byte_tokenizer_round_trip():
    tok = ByteLevelTokenizer()
    text = "héllo, wörld"
    assert tok.decode(tok.encode(text)) == text
    assert tok.vocab_size == 258 and tok.eod == 256 and tok.pad == 257


def test_hf_tokenizer_missing_path_is_clear():
    with pytest.raises(ValueError, match="tokenizer-model"):
        build_tokenizer("HuggingFaceTokenizer", "/nonexistent/tokenizer")
    with pytest.raises(ValueError, match="tokenizer-type"):
        build_tokenizer("SentencePiece")


def test_synthetic_is_deterministic_long_tailed_and_learnable():
    corpus = SyntheticCorpus(vocab_size=64, seq_length=256, seed=7)
    again = SyntheticCorpus(vocab_size=64, seq_length=256, seed=7)
    other = SyntheticCorpus(vocab_size=64, seq_length=256, seed=8)
    assert np.array_equal(corpus[3].tokens, again[3].tokens)
    assert not np.array_equal(corpus[3].tokens, other[3].tokens)
    lengths = np.array([corpus.length(i) for i in range(2000)])
    assert lengths.min() >= 8 and lengths.max() <= 256
    assert np.mean(lengths) > np.median(lengths) * 1.1  # right tail
    assert (lengths == 256).sum() > 0 and (lengths < 64).sum() > 1000
    sample = corpus[5]
    assert len(sample.tokens) == corpus.length(5) + 1
    assert sample.tokens.min() >= 1 and sample.tokens.max() < 64
    # the walk: most consecutive differences equal the document's stride
    diffs = np.diff(sample.tokens - 1) % 63
    values, counts = np.unique(diffs, return_counts=True)
    assert counts.max() >= 0.8 * len(diffs) and values[counts.argmax()] in (1, 2, 3, 5)


def test_collate_pads_right_and_masks_padding():
    a = Sample(tokens=np.arange(1, 6), loss_mask=np.ones(4, np.float32))
    b = Sample(tokens=np.arange(10, 13), loss_mask=np.array([0, 1], np.float32))
    mb = collate([a, b], pad_id=0)
    assert tuple(mb.tokens.shape) == (2, 4)
    assert mb.tokens[1, :2].tolist() == [10, 11]
    assert mb.labels[1].tolist() == [11, 12, 0, 0]
    assert mb.loss_mask[1].tolist() == [0, 1, 0, 0]
    assert mb.num_tokens == 5


def test_split_fixed_and_by_tokens():
    assert split_fixed(list(range(6)), 2) == [[0, 1], [2, 3], [4, 5]]
    with pytest.raises(ValueError):
        split_fixed(list(range(5)), 2)
    groups = split_by_tokens([0, 1, 2, 3, 4], [10, 10, 30, 5, 40], max_tokens=40)
    assert sum(groups, []) == [0, 1, 2, 3, 4]
    lengths = {0: 10, 1: 10, 2: 30, 3: 5, 4: 40}
    for group in groups:
        assert len(group) * max(lengths[i] for i in group) <= 40
    assert groups == [[0, 1], [2], [3], [4]] or groups == [[0, 1], [2, 3], [4]]


def test_jsonl_text_and_messages(tmp_path):
    path = tmp_path / "data.jsonl"
    records = [{"text": "abc"},
               {"messages": [{"role": "user", "content": "hi"},
                             {"role": "assistant", "content": "yo"}]}]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    tok = ByteLevelTokenizer()
    data = JsonlDataset([str(path)], tok, seq_length=64)
    assert len(data) == 2
    text = data[0]
    assert text.tokens.tolist() == [97, 98, 99, 256] and text.loss_mask.tolist() == [1, 1, 1]
    chat = data[1]
    decoded = tok.decode(chat.tokens.tolist())
    assert "<|user|>\nhi" in decoded and "<|assistant|>\nyo" in decoded
    # only the assistant reply (and its end token) is scored
    scored = [int(t) for t, m in zip(chat.tokens[1:], chat.loss_mask) if m > 0]
    assert scored == tok.encode("yo") + [tok.eod]
    truncated = encode_document({"text": "x" * 100}, tok, seq_length=16)
    assert len(truncated.tokens) == 17
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "1"}\n{oops\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        JsonlDataset([str(bad)], tok, seq_length=16)


def test_indexed_dataset_round_trip(tmp_path):
    path = tmp_path / "data.jsonl"
    texts = ["first document", "second", "third one here"]
    path.write_text("\n".join(json.dumps({"text": t}) for t in texts))
    prefix = str(tmp_path / "out" / "corpus")
    assert preprocess_jsonl([str(path)], prefix, tokenizer_type="ByteLevelTokenizer") == 3
    data = IndexedTokenDataset([prefix], seq_length=8, pad_id=257)
    tok = ByteLevelTokenizer()
    assert len(data) == 3
    assert data[1].tokens.tolist() == tok.encode("second") + [256]
    assert data[0].tokens.tolist() == tok.encode("first document")[:9]
    assert data.length(0) == 8
    with pytest.raises(ValueError, match="preprocess_data"):
        IndexedTokenDataset([str(tmp_path / "missing")], seq_length=8, pad_id=0)


def test_shuffled_source_epochs_are_permutations():
    class Tiny:
        pad_id = 0

        def __len__(self):
            return 5

        def __getitem__(self, i):
            return i

        def length(self, i):
            return i

    source = ShuffledSource(Tiny(), seed=3)
    first = [source[i] for i in range(5)]
    second = [source[i] for i in range(5, 10)]
    assert sorted(first) == sorted(second) == list(range(5))
    assert [ShuffledSource(Tiny(), seed=3)[i] for i in range(10)] == first + second


@pytest.mark.parametrize("line, message", [
    ('[1, 2]', "bad.jsonl:2: a JSONL record must be a JSON object"),
    ('"just a string"', "bad.jsonl:2: a JSONL record must be a JSON object"),
    ('{"prompt": "x"}', "bad.jsonl:2: JSONL record needs one of 'text', 'messages', "
                        "'conversations' and 'input_ids'"),
    ('{"messages": "hello"}', r"bad.jsonl:2: 'messages' must be a list .* got a JSON string"),
    ('{"messages": ["hello"]}', r"bad.jsonl:2: messages\[0\] must be an object"),
    ('{"messages": [{"role": "assistant", "content": "a"}, 3]}',
     r"bad.jsonl:2: messages\[1\] must be an object .* got a JSON number"),
    ('{"conversations": [{"from": "bot", "value": "a"}]}',
     r"bad.jsonl:2: conversations\[0\].from = 'bot' is not one of"),
    ('{"conversations": [{"from": "gpt", "value": 3}]}',
     r"bad.jsonl:2: conversations\[0\] must be an object with a string 'value'"),
], ids=["array", "string", "no-key", "messages-not-list", "message-not-object",
        "second-message-number", "sharegpt-role", "sharegpt-value"])
def test_bad_jsonl_record_names_file_and_line(tmp_path, line, message):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n' + line + "\n")
    with pytest.raises(ValueError, match=message):
        JsonlDataset([str(bad)], ByteLevelTokenizer(), seq_length=16)
    with pytest.raises(ValueError, match=message):  # preprocessing reads it the same way
        preprocess_jsonl([str(bad)], str(tmp_path / "out"), tokenizer_type="ByteLevelTokenizer")


def test_sharegpt_conversations_encode_as_their_messages(tmp_path):
    """Hugging Face SFT sets (Magpie, ShareGPT) store {"conversations": [{"from", "value"}]}:
    the same sample as the equivalent "messages" record, assistant turns scored."""
    turns = [("system", "be brief"), ("human", "hi there"), ("gpt", "hello!"),
             ("human", "bye"), ("gpt", "ciao")]
    roles = {"system": "system", "human": "user", "gpt": "assistant"}
    sharegpt = {"conversations": [{"from": f, "value": v} for f, v in turns]}
    messages = {"messages": [{"role": roles[f], "content": v} for f, v in turns]}
    tokenizer = ByteLevelTokenizer()
    a = encode_document(sharegpt, tokenizer, 256)
    b = encode_document(messages, tokenizer, 256)
    assert a.tokens.tolist() == b.tokens.tolist()
    assert a.loss_mask.tolist() == b.loss_mask.tolist() and 0 < a.loss_mask.sum() < len(a.loss_mask)


def test_non_utf8_line_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"text": "fine"}\n\n{"text": "\xff"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:3: not UTF-8"):
        JsonlDataset([str(bad)], ByteLevelTokenizer(), seq_length=16)


def test_file_without_assistant_turns_says_so_naming_the_file(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"text": "scored"}) + "\n")
    chat = tmp_path / "chat.jsonl"
    chat.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                                       {"role": "system", "content": "s"}]})
                              for _ in range(3)) + "\n")
    for paths in ([chat], [good, chat]):
        with pytest.raises(ValueError, match=r"chat.jsonl: no record has an assistant turn"):
            JsonlDataset([str(p) for p in paths], ByteLevelTokenizer(), seq_length=64)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(ValueError, match="empty.jsonl: no records"):
        JsonlDataset([str(empty)], ByteLevelTokenizer(), seq_length=64)
    # an assistant reply beyond --seq-length: the file has a turn, none of it is scored
    late = tmp_path / "late.jsonl"
    late.write_text(json.dumps({"messages": [{"role": "user", "content": "x" * 100},
                                             {"role": "assistant", "content": "y"}]}) + "\n")
    with pytest.raises(ValueError, match=r"late.jsonl: no usable documents .*--seq-length 16"):
        JsonlDataset([str(late)], ByteLevelTokenizer(), seq_length=16)
