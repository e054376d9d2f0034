"""odc_pp/training/checkpoint/checkpointing.py in one process: atomic saves, retention of only this
run's checkpoints, atomic pruning, checksummed rank files, start-up checks of --save."""

from __future__ import annotations

import os
import shutil
from collections import namedtuple

import pytest
import torch

from odc_pp.training.checkpoint import checkpointing
from odc_pp.training.checkpoint.checkpointing import (CheckpointSaver, CorruptCheckpointError,
                                           checkpoint_dir, free_space_problem,
                                           latest_iteration, list_iterations,
                                           load_rank_state, prune_checkpoint, rank_file,
                                           read_meta, remove_leftovers, save_checkpoint,
                                           save_dir_problem, write_rank_file)
from odc_pp.training.checkpoint.resume import model_differences


def _second_rank_writer(save: str, iteration: int):
    """Single-process emulation of two ranks: "rank 1" writes its file at the first barrier."""
    calls = []

    def barrier():
        calls.append(1)
        if len(calls) == 1:
            tmp = os.path.join(save, f".tmp_iter_{iteration:07d}")
            write_rank_file(rank_file(tmp, 1), {"value": torch.tensor([iteration, 1])})
    return barrier


def test_checkpoint_atomic_keep_and_resume(tmp_path):
    save = str(tmp_path / "ckpt")
    assert latest_iteration(save) is None
    saver = CheckpointSaver(save, keep=2, rank=0, world_size=2, barrier=lambda: None)
    for iteration in (2, 4, 6):
        saver.barrier = _second_rank_writer(save, iteration)
        saver.save(iteration, {"value": torch.tensor([iteration, 0])}, meta={"pp": 2})
    assert sorted(os.listdir(save)) == ["iter_0000004", "iter_0000006", "latest"]
    assert latest_iteration(save) == 6
    directory = checkpoint_dir(save, 6)
    assert load_rank_state(directory, 1)["value"].tolist() == [6, 1]
    assert load_rank_state(directory, 0)["value"].tolist() == [6, 0]
    assert read_meta(directory) == {"pp": 2, "iteration": 6, "world_size": 2}
    with pytest.raises(ValueError, match="not a complete odc-pp checkpoint"):
        read_meta(checkpoint_dir(save, 2))  # pruned


def test_checkpoint_missing_rank_file_fails(tmp_path):
    with pytest.raises(RuntimeError, match="ranks \\[1\\].*shared storage"):
        save_checkpoint(str(tmp_path), 1, {}, rank=0, world_size=2, barrier=lambda: None)
    assert latest_iteration(str(tmp_path)) is None
    assert not os.path.exists(checkpoint_dir(str(tmp_path), 1))


def _save(save: str, iteration: int, value: float = 0.0) -> None:
    save_checkpoint(save, iteration, {"value": torch.tensor([value])}, rank=0, world_size=1,
                    barrier=lambda: None)


def test_retention_deletes_only_this_runs_older_checkpoints(tmp_path):
    """An older run left iter 40 (and 3) behind: this run's saves 1..4 with keep 2 prune
    only its own 1 and 2; the newly saved checkpoint always survives."""
    save = str(tmp_path / "ckpt")
    _save(save, 3)
    _save(save, 40)
    saver = CheckpointSaver(save, keep=2, rank=0, world_size=1, barrier=lambda: None)
    for iteration in (1, 2, 4, 5):
        saver.save(iteration, {"value": torch.tensor([float(iteration)])})
        assert os.path.isdir(checkpoint_dir(save, iteration)), iteration
        assert latest_iteration(save) == iteration
    assert list_iterations(save) == [3, 4, 5, 40]
    assert saver.written == [4, 5]
    assert sorted(os.listdir(save)) == ["iter_0000003", "iter_0000004", "iter_0000005",
                                        "iter_0000040", "latest"]


def test_a_checkpoint_is_never_overwritten(tmp_path):
    save = str(tmp_path)
    _save(save, 40, value=1.0)
    with pytest.raises(RuntimeError, match="iter_0000040 exists already.*--load"):
        _save(save, 40, value=2.0)
    assert load_rank_state(checkpoint_dir(save, 40), 0)["value"].tolist() == [1.0]
    assert latest_iteration(save) == 40


def test_an_interrupted_prune_leaves_no_partial_checkpoint(tmp_path, monkeypatch):
    save = str(tmp_path)
    _save(save, 1)
    _save(save, 2)
    real_rmtree = shutil.rmtree

    def crash_midway(path, ignore_errors=False):
        if not os.path.exists(path):
            return
        os.remove(os.path.join(path, "meta.json"))  # part of the tree is gone, then: crash
        raise OSError("simulated crash during delete")

    monkeypatch.setattr(checkpointing.shutil, "rmtree", crash_midway)
    with pytest.raises(OSError, match="simulated crash"):
        prune_checkpoint(save, 1)
    monkeypatch.setattr(checkpointing.shutil, "rmtree", real_rmtree)
    assert list_iterations(save) == [2]  # no partial directory under a final name
    assert os.path.isdir(os.path.join(save, ".prune_iter_0000001"))
    os.makedirs(os.path.join(save, ".tmp_iter_0000003"))  # a crashed save
    assert remove_leftovers(save) == [".prune_iter_0000001", ".tmp_iter_0000003"]
    assert sorted(os.listdir(save)) == ["iter_0000002", "latest"]


def test_rank_files_are_checksummed(tmp_path):
    directory = str(tmp_path)
    path = rank_file(directory, 3)
    state = {"master": [torch.arange(8192, dtype=torch.float32)], "step": 5}
    write_rank_file(path, state)
    assert torch.equal(load_rank_state(directory, 3)["master"][0], state["master"][0])
    good = open(path, "rb").read()
    # 4 KiB of the payload overwritten
    damaged = bytearray(good)
    middle = len(good) // 2
    damaged[middle:middle + 4096] = os.urandom(4096)
    open(path, "wb").write(bytes(damaged))
    with pytest.raises(CorruptCheckpointError, match="rank_00003.pt fails its SHA-256"):
        load_rank_state(directory, 3)
    open(path, "wb").write(good[:len(good) - 100])
    payload = len(good) - (good.index(b"\n") + 1)
    with pytest.raises(CorruptCheckpointError,
                       match=f"rank_00003.pt is truncated: {payload - 100} of {payload} "
                             f"payload bytes"):
        load_rank_state(directory, 3)
    open(path, "wb").write(good[:40])
    with pytest.raises(CorruptCheckpointError, match="rank_00003.pt is truncated \\(40 bytes"):
        load_rank_state(directory, 3)
    torch.save(state, path)  # no checksum header
    with pytest.raises(CorruptCheckpointError, match="rank_00003.pt is not an odc-pp rank"):
        load_rank_state(directory, 3)
    os.remove(path)
    with pytest.raises(CorruptCheckpointError, match="rank_00003.pt is missing"):
        load_rank_state(directory, 3)


def test_save_dir_checks(tmp_path, monkeypatch):
    assert save_dir_problem(str(tmp_path / "new" / "ckpt"), 0) is None
    assert os.path.isdir(tmp_path / "new" / "ckpt") and not os.listdir(tmp_path / "new" / "ckpt")
    (tmp_path / "file").write_text("x")
    problem = save_dir_problem(str(tmp_path / "file" / "ckpt"), 2)
    assert problem.startswith(f"--save {tmp_path / 'file' / 'ckpt'} is not writable by rank 2")
    assert free_space_problem(str(tmp_path), 1024) is None
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(checkpointing.shutil, "disk_usage",
                        lambda path: usage(10 * 2 ** 20, 9 * 2 ** 20, 2 ** 20))
    problem = free_space_problem(str(tmp_path), 5 * 2 ** 20)
    assert problem == (f"--save {tmp_path} has 1.0 MiB free, this run's checkpoints need "
                       f"about 5.0 MiB; free space or give another --save directory")


def test_model_differences_name_the_flag():
    saved = {"num_layers": 4, "hidden_size": 32, "num_attention_heads": 4,
             "ffn_hidden_size": 128, "max_position_embeddings": 48, "vocab_size": 48}
    assert model_differences(saved, dict(saved)) == []
    assert model_differences(saved, dict(saved, num_attention_heads=2, ffn_hidden_size=64)) == [
        "num_attention_heads: saved 4 vs now 2 (--num-attention-heads)",
        "ffn_hidden_size: saved 128 vs now 64 (--ffn-hidden-size)"]


def _draws():
    import random

    import numpy as np
    draws = [random.random(), float(np.random.rand()), float(torch.rand(()))]
    if torch.cuda.is_available():
        draws.append(float(torch.rand((), device="cuda")))
    return draws


def test_rng_state_round_trips_through_a_rank_file(tmp_path):
    """Python, NumPy, torch CPU (and, on a GPU machine, CUDA and megatron's tracker) streams
    continue exactly where the checkpoint left them."""
    if torch.cuda.is_available():
        torch.cuda.init()
    checkpointing.write_rank_file(checkpointing.rank_file(str(tmp_path), 0),
                                  {"rng": checkpointing.capture_rng_state()})
    expected = _draws()
    _draws()  # move every stream on
    state = checkpointing.load_rank_state(str(tmp_path), 0)
    checkpointing.restore_rng_state(state["rng"])
    assert _draws() == expected
    assert ("cuda" in state["rng"]) == torch.cuda.is_available()


@pytest.mark.gpu
def test_megatron_cuda_rng_tracker_state_is_restored(tmp_path):
    from megatron.core.tensor_parallel import random as megatron_random

    from odc_pp.megatron.compat import prepare_megatron_for_device

    prepare_megatron_for_device("cuda", seed=7)
    tracker = megatron_random.get_cuda_rng_tracker()
    state = checkpointing.capture_rng_state()
    with tracker.fork():
        expected = torch.rand(4, device="cuda")
    checkpointing.restore_rng_state(state)
    with tracker.fork():
        assert torch.equal(torch.rand(4, device="cuda"), expected)
