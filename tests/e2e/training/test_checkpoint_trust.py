"""End-to-end (pretrain_gpt.py through torchrun, tiny GPT, one rank): what ``--load``
trusts. A renamed or symlinked checkpoint resumes at the iteration it records or not at all
(``--override-resume-iteration`` forces one); a crafted rank file runs no code; a truncated
``.distcp`` of a Megatron checkpoint is named. Every refusal exits 2 before the first step."""

from __future__ import annotations

import hashlib
import io
import os
import shutil

import pytest
import torch

from odc_pp.testing.torchrun import TINY_MODEL, launch

pytestmark = pytest.mark.multiproc

FLAGS = TINY_MODEL + ["--pipeline-schedule", "1f1b"]
STOCK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "megatron_stock.py")


def _refused(run, *messages: str) -> None:
    """The job failed with exit status 2 and the messages, before the first step."""
    assert run.returncode != 0, run.describe()
    assert 2 in run.exit_codes().values(), run.describe()
    for message in messages:
        assert message in run.stderr, run.describe()
    assert not os.path.exists(run.log_path), "an iteration ran before the refusal"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Checkpoints of iterations 2 and 4 (one rank)."""
    tmp = tmp_path_factory.mktemp("saved")
    run = launch(FLAGS + ["--train-iters", "4", "--save", str(tmp / "ckpt"),
                          "--save-interval", "2"], nproc=1, tmp_path=tmp, name="base")
    assert run.returncode == 0, run.describe()
    assert sorted(os.listdir(tmp / "ckpt")) == ["iter_0000002", "iter_0000004", "latest"]
    return tmp / "ckpt"


def _copy(saved, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(saved, ckpt, symlinks=True)
    return ckpt


def test_a_renamed_checkpoint_is_refused_and_an_override_is_deliberate(saved, tmp_path):
    """``mv iter_0000004 iter_0000008; echo 8 > latest`` used to resume at 9 with iteration
    4's state."""
    ckpt = _copy(saved, tmp_path)
    os.rename(ckpt / "iter_0000004", ckpt / "iter_0000008")
    (ckpt / "latest").write_text("8\n")
    flags = FLAGS + ["--train-iters", "10", "--load", str(ckpt)]
    run = launch(flags, nproc=1, tmp_path=tmp_path, name="renamed")
    directory = ckpt / "iter_0000008"
    _refused(run, f"checkpoint {directory} states different iterations (the directory name "
                  f"{directory} says 8; {ckpt / 'latest'} says 8; "
                  f"{directory / 'meta.json'} says 4)",
             "--override-resume-iteration N")
    forced = launch(flags + ["--override-resume-iteration", "8"], nproc=1, tmp_path=tmp_path,
                    name="forced")
    assert forced.returncode == 0, forced.describe()
    assert (f"resumed from {ckpt} at iteration 8 (exact; iteration 8 by "
            f"--override-resume-iteration, the checkpoint records 4)") in forced.stdout
    assert [r["iteration"] for r in forced.records()] == [9, 10]


def test_a_symlinked_checkpoint_is_refused(saved, tmp_path):
    """``iter_0000003 -> iter_0000002`` named by ``latest`` used to resume at 3 with
    iteration 2's state."""
    ckpt = _copy(saved, tmp_path)
    os.symlink("iter_0000002", ckpt / "iter_0000003")
    shutil.rmtree(ckpt / "iter_0000004")
    (ckpt / "latest").write_text("3\n")
    run = launch(FLAGS + ["--train-iters", "6", "--load", str(ckpt)], nproc=1,
                 tmp_path=tmp_path, name="symlinked")
    _refused(run, f"the directory name {ckpt / 'iter_0000003'} says 3; the symlink target "
                  f"{os.path.realpath(ckpt / 'iter_0000002')} says 2")


class _Marker:
    """Pickles as a call that creates a file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_crafted_rank_file_runs_no_code(saved, tmp_path):
    ckpt = _copy(saved, tmp_path)
    marker = tmp_path / "marker"
    buffer = io.BytesIO()
    torch.save({"iteration": 4, "hook": _Marker(str(marker))}, buffer)
    payload = buffer.getvalue()
    path = ckpt / "iter_0000004" / "rank_00000.pt"
    path.write_bytes(b"odc-pp rank file v1 %s %020d\n" % (
        hashlib.sha256(payload).hexdigest().encode(), len(payload)) + payload)
    run = launch(FLAGS + ["--train-iters", "6", "--load", str(ckpt)], nproc=1,
                 tmp_path=tmp_path, name="crafted")
    assert not marker.exists(), "loading the rank file ran its code"
    _refused(run, f"checkpoint file {path} holds something odc-pp rank files never contain, "
                  f"so it was not loaded and none of its code ran")


MEGATRON_FLAGS = ["--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4",
                  "--seq-length", "16", "--max-position-embeddings", "16", "--mock-data",
                  "--vocab-size", "48", "--global-batch-size", "2", "--micro-batch-size", "1",
                  "--lr", "0", "--min-lr", "0", "--no-progress-bar", "--train-iters", "6",
                  "--distributed-timeout-minutes", "1.5", "--untie-embeddings-and-output-weights"]
"""The model of megatron_stock.py (untied)."""


def test_a_truncated_distcp_of_a_megatron_checkpoint_is_named(tmp_path):
    made = launch(["save", str(tmp_path)], nproc=1, tmp_path=tmp_path, name="stock",
                  log=False, script=STOCK)
    assert made.returncode == 0, made.describe()
    directory = tmp_path / "megatron" / "iter_0000005"
    path = sorted(directory.glob("*.distcp"))[0]
    size = path.stat().st_size
    os.truncate(path, size // 3)
    run = launch(MEGATRON_FLAGS + ["--load", str(tmp_path / "megatron")], nproc=1,
                 tmp_path=tmp_path, name="truncated")
    _refused(run, f"torch_dist checkpoint file {path} is truncated: {size // 3} bytes, its "
                  f".metadata locates data up to byte")
    assert "EOFError" not in run.stderr, run.describe()
