"""Reading a torch_dist (torch.distributed.checkpoint) directory in one process
(:func:`odc_pp.megatron.dist_ckpt.read_megatron_tensors`): every damaged file is named with
what is wrong, and a crafted ``.metadata`` runs no code."""

from __future__ import annotations

import os
import pickle

import pytest
import torch
from torch.distributed.checkpoint import save as dcp_save

from odc_pp.megatron.dcp_reader import DamagedCheckpointError
from odc_pp.megatron.dist_ckpt import read_megatron_tensors

TENSORS = {"embedding.word_embeddings.weight": torch.arange(48.0).view(12, 4),
           "decoder.layers.mlp.linear_fc1.weight": torch.linspace(-1, 1, 64).view(2, 8, 4),
           "decoder.final_layernorm.weight": torch.ones(4)}


@pytest.fixture
def checkpoint(tmp_path):
    directory = tmp_path / "iter_0000010"
    dcp_save({key: value.clone() for key, value in TENSORS.items()},
             checkpoint_id=str(directory), no_dist=True)
    return directory


def _data_file(directory) -> str:
    (name,) = [name for name in os.listdir(directory) if name.endswith(".distcp")]
    return str(directory / name)


def test_an_intact_checkpoint_reads_back(checkpoint):
    tensors = read_megatron_tensors(str(checkpoint))
    assert sorted(tensors) == sorted(TENSORS)
    for key, value in TENSORS.items():
        assert torch.equal(tensors[key], value), key


def test_a_truncated_distcp_is_named(checkpoint):
    path = _data_file(checkpoint)
    size = os.path.getsize(path)
    os.truncate(path, size // 2)
    with pytest.raises(DamagedCheckpointError,
                       match=f"torch_dist checkpoint file {path} is truncated: {size // 2} "
                             f"bytes, its .metadata locates data up to byte {size}"):
        read_megatron_tensors(str(checkpoint))


def test_a_corrupt_distcp_is_named_with_the_tensor(checkpoint):
    path = _data_file(checkpoint)
    data = bytearray(open(path, "rb").read())
    data[:] = bytes(byte ^ 0xFF for byte in data)  # same length, nothing decodes
    with open(path, "wb") as handle:
        handle.write(data)
    with pytest.raises(DamagedCheckpointError,
                       match=f"torch_dist checkpoint file {path} is damaged: tensor '.*' at "
                             f"bytes \\d+-\\d+ cannot be decoded"):
        read_megatron_tensors(str(checkpoint))


def test_a_missing_distcp_is_named(checkpoint):
    path = _data_file(checkpoint)
    os.remove(path)
    with pytest.raises(DamagedCheckpointError, match=f"file {path} is missing"):
        read_megatron_tensors(str(checkpoint))


@pytest.mark.parametrize("keep", [0, 10, 0.5])
def test_a_truncated_metadata_is_named(checkpoint, keep):
    path = str(checkpoint / ".metadata")
    size = os.path.getsize(path)
    os.truncate(path, int(size * keep) if isinstance(keep, float) else keep)
    with pytest.raises(DamagedCheckpointError,
                       match=f"torch_dist checkpoint file {path} is truncated or damaged"):
        read_megatron_tensors(str(checkpoint))


class _Marker:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_crafted_metadata_runs_no_code_and_is_named(checkpoint, tmp_path):
    path = str(checkpoint / ".metadata")
    marker = tmp_path / "marker"
    with open(path, "wb") as handle:
        pickle.dump(_Marker(str(marker)), handle)
    with pytest.raises(DamagedCheckpointError) as raised:
        read_megatron_tensors(str(checkpoint))
    assert not marker.exists(), "unpickling .metadata ran its code"
    assert f"torch_dist checkpoint file {path} was not loaded (nothing in it ran): it refers " \
           f"to io.open" in str(raised.value)
