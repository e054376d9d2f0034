"""The tokenizer is never a guess (issue 51, item 1): with ``--hf-checkpoint DIR`` and no
tokenizer flag the data is tokenized with DIR's own tokenizer; a DIR without one is an
error naming the flags (the byte-level tokenizer only when asked for, or with
``--mock-data``); a tokenizer whose special ids do not fit the model is refused; the
checkpoint records the tokenizer used with a SHA-256 of its files. Tiny models and
tokenizers made here (no download)."""

from __future__ import annotations

import json
import os

import pytest

from tests.dist.models._tiny import make_hf_model
from tests.unit.data.tiny_hf import CHATML_PLAIN, word_level_tokenizer

pytest.importorskip("transformers")

TEXTS = ["hello there how are you", "fine thanks sure here is the answer",
         "the answer to your question is a b c", "user assistant system hello"]


def _hf_dir(tmp_path, *, tokenizer: bool = True, eos: int = 3, pad: int | None = 1,
            vocab: int = 32) -> str:
    """A tiny Llama (``vocab`` embedding rows) with, in the same directory, a word-level
    tokenizer of 27 tokens (eos ``</s>`` = 3, pad ``<pad>`` = 1)."""
    directory = str(tmp_path / "hf")
    make_hf_model("llama", directory, vocab_size=vocab, num_layers=2)
    path = os.path.join(directory, "config.json")
    config = json.loads(open(path).read())
    config.update(eos_token_id=eos, pad_token_id=pad, bos_token_id=2)
    with open(path, "w") as handle:
        json.dump(config, handle)
    if tokenizer:
        word_level_tokenizer(directory, CHATML_PLAIN)
    return directory


def _data(tmp_path) -> str:
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in TEXTS))
    return str(path)


def _flags(hf_dir, data, *extra):
    return ["--hf-checkpoint", hf_dir, "--data-path", data, "--seq-length", "16",
            "--global-batch-size", "2", "--micro-batch-size", "1", *extra]


def test_the_checkpoints_own_tokenizer_is_the_default(tmp_path):
    from transformers import AutoTokenizer

    from odc_pp.training.arguments import parse_args
    from odc_pp.training.data_plan import build_source, tokenizer_log_line

    hf_dir = _hf_dir(tmp_path)
    args = parse_args(_flags(hf_dir, _data(tmp_path)))
    assert args.data.tokenizer_type == "HuggingFaceTokenizer"
    assert args.data.tokenizer_model == hf_dir
    typed = parse_args(_flags(hf_dir, _data(tmp_path), "--tokenizer-type",
                              "HuggingFaceTokenizer"))
    assert typed.data.tokenizer_model == hf_dir  # the type alone: the checkpoint's too
    source, vocab = build_source(args)
    assert vocab == 32
    theirs = AutoTokenizer.from_pretrained(hf_dir)
    expected = {tuple(theirs.encode(text, add_special_tokens=False) + [theirs.eos_token_id])
                for text in TEXTS}
    assert {tuple(source[index].tokens.tolist()) for index in range(len(TEXTS))} == expected
    line = tokenizer_log_line(args, vocab)
    assert line.startswith(f"tokenizer: HuggingFaceTokenizer {hf_dir} (the --hf-checkpoint's "
                           f"own), vocabulary {len(theirs)} tokens")
    assert line.endswith("model vocabulary 32")


def test_a_checkpoint_without_a_tokenizer_needs_it_named(tmp_path):
    from odc_pp.training.arguments import parse_args
    from odc_pp.training.data_plan import build_source

    hf_dir = _hf_dir(tmp_path, tokenizer=False, vocab=264)  # room for the 258 byte ids
    data = _data(tmp_path)
    with pytest.raises(ValueError, match=r"--hf-checkpoint .* holds no tokenizer .*"
                                         r"--tokenizer-model PATH, or --tokenizer-type "
                                         r"ByteLevelTokenizer"):
        parse_args(_flags(hf_dir, data))
    byte_level = parse_args(_flags(hf_dir, data, "--tokenizer-type", "ByteLevelTokenizer"))
    assert byte_level.data.tokenizer_type == "ByteLevelTokenizer"  # asked for: used
    source, _ = build_source(byte_level)
    expected = {tuple((list(text.encode()) + [256])[:17]) for text in TEXTS}  # bytes, eod
    assert {tuple(source[index].tokens.tolist()) for index in range(4)} == expected
    mock = parse_args(["--hf-checkpoint", hf_dir, "--mock-data", "--seq-length", "16"])
    assert mock.data.tokenizer_model is None  # synthetic ids: no tokenizer


def test_another_models_tokenizer_is_refused(tmp_path):
    from odc_pp.training.arguments import parse_args
    from odc_pp.training.data_plan import build_source

    data = _data(tmp_path)
    other_eos = _hf_dir(tmp_path / "eos", eos=2)  # the config's eos is <s>, not </s>
    with pytest.raises(ValueError, match=r"eos id 3 is not the model config's eos_token_id 2"):
        build_source(parse_args(_flags(other_eos, data)))
    other_pad = _hf_dir(tmp_path / "pad", pad=0)
    with pytest.raises(ValueError, match=r"pad id 1 is not the model config's pad_token_id 0"):
        build_source(parse_args(_flags(other_pad, data)))
    small = _hf_dir(tmp_path / "small", vocab=16)
    with pytest.raises(ValueError, match=r"the tokenizer has 27 tokens, more than the "
                                         r"vocab_size 16"):
        build_source(parse_args(_flags(small, data)))


def test_the_checkpoint_records_the_tokenizer_used(tmp_path):
    from odc_pp.data.tokenizer_identity import tokenizer_paths, tokenizer_sha256
    from odc_pp.training.arguments import parse_args
    from odc_pp.training.checkpoint.resume import _tokenizer_used

    hf_dir = _hf_dir(tmp_path)
    data = _data(tmp_path)
    record = _tokenizer_used(parse_args(_flags(hf_dir, data)))
    assert record == {"tokenizer_type": "HuggingFaceTokenizer",
                      "tokenizer_dir": os.path.abspath(hf_dir),
                      "tokenizer_sha256": tokenizer_sha256(tokenizer_paths(hf_dir), hf_dir)}
    byte_level = _tokenizer_used(parse_args(_flags(hf_dir, data, "--tokenizer-type",
                                                   "ByteLevelTokenizer")))
    assert byte_level == {"tokenizer_type": "ByteLevelTokenizer", "tokenizer_dir": None,
                          "tokenizer_sha256": None}  # not the directory's tokenizer
    with open(os.path.join(hf_dir, "tokenizer_config.json"), "a") as handle:
        handle.write(" ")
    assert _tokenizer_used(parse_args(_flags(hf_dir, data)))["tokenizer_sha256"] != \
        record["tokenizer_sha256"]
