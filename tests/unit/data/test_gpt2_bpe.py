"""Megatron's --vocab-file / --merge-file: the GPT-2 BPE tokenizer built from vocab.json
and merges.txt (--tokenizer-type GPT2BPETokenizer, implied by the files), and one named
error (exit 2 from pretrain_gpt.py) when a file is missing, not a failure at step 1."""

import json

import pytest

from odc_pp.data.tokenizers import GPT2BPETokenizer, build_tokenizer
from odc_pp.training.arguments import parse_args
from odc_pp.training.training import main


@pytest.fixture()
def bpe_files(tmp_path):
    vocab = {"a": 0, "b": 1, "ab": 2, "\u0120": 3, "<|endoftext|>": 4}
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b\n")
    return str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt")


def test_vocab_and_merge_files_build_the_gpt2_tokenizer(bpe_files):
    vocab, merges = bpe_files
    args = parse_args(["--data-path", "x", "--vocab-file", vocab, "--merge-file", merges])
    assert args.data.tokenizer_type == "GPT2BPETokenizer"
    tokenizer = build_tokenizer(args.data.tokenizer_type, vocab_file=vocab, merge_file=merges)
    assert isinstance(tokenizer, GPT2BPETokenizer)
    assert tokenizer.encode("ab ab") == [2, 3, 2]
    assert tokenizer.decode([2, 3, 2]) == "ab ab"
    assert (tokenizer.eod, tokenizer.pad, tokenizer.vocab_size) == (4, 4, 5)


@pytest.mark.parametrize("flags, message", [
    (["--tokenizer-type", "GPT2BPETokenizer"], "needs --vocab-file and --merge-file"),
    (["--vocab-file", "VOCAB"], "needs --merge-file"),
    (["--merge-file", "MERGES"], "needs --vocab-file"),
    (["--vocab-file", "/no/vocab.json", "--merge-file", "MERGES"], "--vocab-file '/no/vocab.json': no such file"),
    (["--vocab-file", "VOCAB", "--merge-file", "MERGES", "--tokenizer-type",
      "ByteLevelTokenizer"], "belong to --tokenizer-type GPT2BPETokenizer"),
])
def test_missing_or_contradicting_files_exit_2_naming_the_flag(bpe_files, capsys, flags, message):
    vocab, merges = bpe_files
    flags = [vocab if f == "VOCAB" else merges if f == "MERGES" else f for f in flags]
    with pytest.raises(ValueError, match=message):
        parse_args(["--data-path", "x", *flags])
    assert main(["--data-path", "x", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_malformed_vocab_is_named(tmp_path):
    (tmp_path / "vocab.json").write_text("not json")
    (tmp_path / "merges.txt").write_text("#version: 0.2\n")
    with pytest.raises(ValueError, match="--vocab-file .*not a GPT-2 BPE vocabulary"):
        GPT2BPETokenizer(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"))


def test_gpt2_ids_without_the_files_are_a_named_error(tmp_path):
    """GPT-2-tokenized indexed data read with the default byte-level tokenizer: an error
    naming the file, the id and the flags to give, before training (not an IndexError)."""
    import torch
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    from odc_pp.training.data_plan import build_source

    prefix = str(tmp_path / "gpt2")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=DType.optimal_dtype(50257))
    for document in ([464, 3290, 50256], [40, 1101, 373, 50256]):
        builder.add_item(torch.tensor(document, dtype=torch.int64))
        builder.end_document()
    builder.finalize(prefix + ".idx")
    args = parse_args(["--data-path", prefix, "--seq-length", "4"])
    with pytest.raises(ValueError, match=r"gpt2.bin: document 0, position 0: token id 464 .*"
                                         r"--vocab-file and --merge-file"):
        build_source(args)
