"""Every damaged input names its file (issue 53 item 7): truncated or mismatched
``.idx``/``.bin`` pairs (in a blend too) with the byte range, and truncated safetensors
files (``model.safetensors``, shard 2 of 3) instead of NumPy's or safetensors' bare
errors."""

import json
import os
import shutil

import pytest
import torch

from odc_pp.data.datasets import IndexedTokenDataset
from odc_pp.data.preprocess import preprocess_jsonl
from odc_pp.megatron.hf import SafetensorsReader, save_hf_directory
from odc_pp.training.arguments import parse_args
from odc_pp.training.data_plan import build_source, build_valid_source


def _corpus(tmp_path, name: str, texts: list[str]) -> str:
    source = tmp_path / f"{name}.jsonl"
    source.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    prefix = str(tmp_path / name)
    preprocess_jsonl([str(source)], prefix, tokenizer_type="ByteLevelTokenizer")
    return prefix


def _truncate(path: str, size: int) -> None:
    with open(path, "r+b") as handle:
        handle.truncate(size)


@pytest.fixture()
def prefixes(tmp_path):
    return (_corpus(tmp_path, "a", ["first document", "second", "third one here"]),
            _corpus(tmp_path, "b", ["another corpus", "of two documents, longer ones"]))


def test_a_truncated_bin_names_the_file_and_the_missing_bytes(prefixes):
    a, _ = prefixes
    size = os.path.getsize(f"{a}.bin")
    _truncate(f"{a}.bin", size - 5)
    with pytest.raises(ValueError) as caught:
        IndexedTokenDataset([a], seq_length=8, pad_id=257)
    assert str(caught.value) == (
        f"--data-path {a}: {a}.bin is truncated or not the pair of {a}.idx: the index places "
        f"3 sequences in bytes 0-{size}, the file has {size - 5} bytes (bytes "
        f"{size - 5}-{size} are missing)")
    _truncate(f"{a}.bin", 0)  # empty: NumPy's "cannot mmap an empty file" before
    with pytest.raises(ValueError, match=rf"{a}.bin is truncated .* the file has 0 bytes"):
        IndexedTokenDataset([a], seq_length=8, pad_id=257)


@pytest.mark.parametrize("keep,needle", [
    (20, "fewer than the 34-byte header (bytes 20-34 are missing)"),
    (40, "its header announces 3 sequences and 4 documents, which need bytes 0-102, the file "
         "has 40 bytes (bytes 40-102 are missing; preprocess the data again)"),
])
def test_a_truncated_idx_names_the_file_and_the_missing_bytes(prefixes, keep, needle):
    a, _ = prefixes
    _truncate(f"{a}.idx", keep)
    with pytest.raises(ValueError) as caught:
        IndexedTokenDataset([a], seq_length=8, pad_id=257)
    assert str(caught.value).startswith(f"--data-path {a}: {a}.idx is truncated: ")
    assert needle in str(caught.value)


def test_a_mismatched_pair_in_a_blend_names_the_files(prefixes):
    a, b = prefixes
    shutil.copyfile(f"{b}.bin", f"{a}.bin")  # a's index, b's tokens (longer)
    with pytest.raises(ValueError) as caught:
        build_source(parse_args(["--data-path", "0.5", b, "0.5", a, "--seq-length", "8",
                                 "--tokenizer-type", "ByteLevelTokenizer"]))
    assert str(caught.value).startswith(
        f"--data-path {a}: {a}.bin is not the pair of {a}.idx: the index places 3 sequences "
        f"in bytes 0-")
    assert "belong to no sequence); give the .bin and .idx written together" in \
        str(caught.value)
    with pytest.raises(ValueError, match=rf"--valid-data-path {a}: {a}.bin is not the pair"):
        build_valid_source(parse_args(["--data-path", b, "--valid-data-path", a,
                                       "--seq-length", "8", "--tokenizer-type",
                                       "ByteLevelTokenizer"]))


def _hf_directory(tmp_path, shard_bytes: int) -> str:
    tensors = {f"model.layers.{k}.weight": torch.full((4, 4), float(k)) for k in range(3)}
    out = str(tmp_path / f"hf_{shard_bytes}")
    save_hf_directory(tensors, {"model_type": "llama"}, out, max_shard_size=shard_bytes)
    return out


def test_a_truncated_single_safetensors_file_names_it(tmp_path):
    directory = _hf_directory(tmp_path, 1 << 20)
    names = sorted(os.listdir(directory))
    single = os.path.join(directory, "model.safetensors")
    os.rename(os.path.join(directory, [n for n in names if n.endswith(".safetensors")][0]),
              single)
    os.remove(os.path.join(directory, "model.safetensors.index.json"))
    size = os.path.getsize(single)
    _truncate(single, size - 10)
    with pytest.raises(ValueError) as caught:
        SafetensorsReader(directory)
    assert str(caught.value) == (
        f"--hf-checkpoint {directory}: model.safetensors is truncated: its tensors need bytes "
        f"0-{size}, the file has {size - 10} bytes (bytes {size - 10}-{size} are missing; "
        f"re-download or re-save the file)")
    _truncate(single, 100)  # inside the header
    with pytest.raises(ValueError, match=r"model.safetensors is truncated: its header needs "
                                         r"bytes 8-\d+, the file has 100 bytes"):
        SafetensorsReader(directory)


def test_shard_2_of_3_truncated_names_the_shard(tmp_path):
    directory = _hf_directory(tmp_path, 64)  # one 4 x 4 float tensor per shard
    shard = "model-00002-of-00003.safetensors"
    assert shard in os.listdir(directory)
    _truncate(os.path.join(directory, shard), 30)
    reader = SafetensorsReader(directory)
    assert reader.get("model.layers.0.weight").sum() == 0
    with pytest.raises(ValueError, match=rf"--hf-checkpoint {directory}: shard {shard} is "
                                         rf"truncated: its header needs bytes 8-\d+, the file "
                                         rf"has 30 bytes"):
        reader.get("model.layers.1.weight")
    with open(os.path.join(directory, "model.safetensors.index.json"), "r+") as handle:
        handle.truncate(20)
    with pytest.raises(ValueError, match=r"model.safetensors.index.json is damaged"):
        SafetensorsReader(directory)
