"""What resuming trusts, in one process: the iteration comes from what a checkpoint records
(meta.json, rank files), not from a directory name, a symlink or ``latest``; and a rank file
is unpickled without running code (``weights_only=True``), a crafted one named."""

from __future__ import annotations

import hashlib
import io
import os
import random

import numpy as np
import pytest
import torch

from odc_pp.training.arguments import parse_args
from odc_pp.training.checkpoint.checkpointing import (UntrustedCheckpointError, checkpoint_dir,
                                           list_iterations, load_rank_state, rank_file,
                                           read_meta, save_checkpoint, write_rank_file)
from odc_pp.training.checkpoint.resharding import assemble_by_name
from odc_pp.training.checkpoint.resume_iteration import (IterationMismatchError, check_rank_iteration,
                                              recorded_iteration)


def _save(save: str, iteration: int) -> str:
    """A one-rank checkpoint whose rank file records its iteration, as the trainer's do."""
    return save_checkpoint(save, iteration, {"iteration": iteration}, rank=0, world_size=1,
                           barrier=lambda: None, meta={"pp": 1})


def test_an_intact_checkpoint_records_its_own_iteration(tmp_path):
    save = str(tmp_path)
    directory = _save(save, 10)
    assert recorded_iteration(directory, read_meta(directory)) == 10
    check_rank_iteration(load_rank_state(directory, 0), rank_file(directory, 0), 10)


def test_a_renamed_checkpoint_is_refused_naming_both_values(tmp_path):
    """``mv iter_0000010 iter_0000020; echo 20 > latest``: the name and latest say 20,
    meta.json records 10."""
    save = str(tmp_path)
    _save(save, 10)
    os.rename(checkpoint_dir(save, 10), checkpoint_dir(save, 20))
    (tmp_path / "latest").write_text("20\n")
    directory = checkpoint_dir(save, 20)
    with pytest.raises(IterationMismatchError) as raised:
        recorded_iteration(directory, read_meta(directory))
    message = str(raised.value)
    assert f"the directory name {directory} says 20" in message
    assert f"{tmp_path / 'latest'} says 20" in message
    assert f"{os.path.join(directory, 'meta.json')} says 10" in message
    assert "--override-resume-iteration N" in message


def test_a_symlinked_checkpoint_is_resolved_and_refused(tmp_path):
    """``iter_0000009 -> iter_0000005``: the name says 9, the target and meta.json 5."""
    save = str(tmp_path)
    _save(save, 5)
    os.symlink("iter_0000005", checkpoint_dir(save, 9))
    assert list_iterations(save) == [5, 9]
    directory = checkpoint_dir(save, 9)
    with pytest.raises(IterationMismatchError) as raised:
        recorded_iteration(directory, read_meta(directory))
    message = str(raised.value)
    assert f"the directory name {directory} says 9" in message
    assert f"the symlink target {os.path.realpath(checkpoint_dir(save, 5))} says 5" in message


def test_a_symlink_under_the_recorded_name_to_another_name_is_refused(tmp_path):
    """The link's name and meta.json agree (5) but it resolves to ``elsewhere/iter_0000007``."""
    elsewhere = tmp_path / "elsewhere"
    _save(str(elsewhere), 7)
    meta = elsewhere / "iter_0000007" / "meta.json"
    meta.write_text(meta.read_text().replace('"iteration": 7', '"iteration": 5'))
    (tmp_path / "load").mkdir()
    link = checkpoint_dir(str(tmp_path / "load"), 5)
    os.symlink(elsewhere / "iter_0000007", link)
    with pytest.raises(IterationMismatchError, match="symlink target .*iter_0000007 says 7"):
        recorded_iteration(link, read_meta(link))


def test_a_rank_file_of_another_iteration_is_refused(tmp_path):
    save = str(tmp_path)
    _save(save, 4)
    directory = _save(save, 6)
    os.replace(rank_file(checkpoint_dir(save, 4), 0), rank_file(directory, 0))
    path = rank_file(directory, 0)
    with pytest.raises(IterationMismatchError,
                       match=f"{path} records iteration 4, but .*meta.json records 6"):
        check_rank_iteration(load_rank_state(directory, 0), path, 6)
    check_rank_iteration(load_rank_state(directory, 0), path, None)  # overridden: no check


def test_resharding_reads_check_every_rank_files_iteration(tmp_path):
    save = str(tmp_path)
    directory = _save(save, 3)
    with pytest.raises(IterationMismatchError, match="records iteration 3, but"):
        assemble_by_name(directory, 1, iteration=8)


def test_override_resume_iteration_flag(tmp_path):
    base = ["--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "2",
            "--seq-length", "8", "--mock-data", "--vocab-size", "32",
            "--global-batch-size", "2", "--train-iters", "2"]
    args = parse_args(base + ["--load", str(tmp_path), "--override-resume-iteration", "20"])
    assert args.checkpoint.override_resume_iteration == 20
    for extra in (["--override-resume-iteration", "20"],
                  ["--load", str(tmp_path), "--finetune", "--override-resume-iteration", "2"],
                  ["--load", str(tmp_path), "--override-resume-iteration", "-1"]):
        with pytest.raises(ValueError, match="--override-resume-iteration .* needs --load"):
            parse_args(base + extra)


# ----- no code runs at load -------------------------------------------------------------------
class _Marker:
    """Pickles as a call that creates a file: what a hostile rank file would do."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _write_with_valid_checksum(path: str, state: dict) -> None:
    """A crafted rank file: any pickle behind a correct odc-pp checksum header."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getvalue()
    with open(path, "wb") as handle:
        handle.write(b"odc-pp rank file v1 %s %020d\n" % (
            hashlib.sha256(payload).hexdigest().encode(), len(payload)))
        handle.write(payload)


def test_a_crafted_rank_file_runs_no_code_and_is_named(tmp_path):
    directory = _save(str(tmp_path / "ckpt"), 2)
    path = rank_file(directory, 0)
    marker = tmp_path / "marker"
    _write_with_valid_checksum(path, {"iteration": 2, "payload": _Marker(str(marker))})
    with pytest.raises(UntrustedCheckpointError) as raised:
        load_rank_state(directory, 0)
    assert not marker.exists(), "unpickling the rank file ran its code"
    message = str(raised.value)
    assert f"checkpoint file {path} holds something odc-pp rank files never contain" in message
    assert "none of its code ran" in message and message.endswith("it imports io.open")
    assert "weights_only=False" not in message  # torch's advice to load it unsafely


def test_what_our_rank_files_hold_loads_with_weights_only(tmp_path):
    """RNG states (Python, NumPy's ndarray, torch), nested lists, tuples and tensors."""
    state = {"rng": {"python": random.getstate(), "numpy": np.random.get_state(),
                     "torch": torch.get_rng_state()},
             "optimizer": {"step": 3, "master": [torch.arange(4.0)]},
             "layout": [{"names": ["w"], "tp": (0, 1), "splits": [[0, True]]}], "iteration": 3}
    write_rank_file(str(tmp_path / "rank_00000.pt"), state)
    loaded = load_rank_state(str(tmp_path), 0)
    assert loaded["rng"]["numpy"][0] == "MT19937"
    assert np.array_equal(loaded["rng"]["numpy"][1], state["rng"]["numpy"][1])
    assert loaded["rng"]["python"] == state["rng"]["python"]
    assert loaded["layout"] == state["layout"] and loaded["iteration"] == 3
