"""End-to-end (pretrain_gpt.py through torchrun, tiny GPT, pp=1 x dp=2): checkpoints never
destroy a newer state, corrupted files are detected and skipped, and bad --load / --save
settings fail before the first step with a message naming the flag."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from odc_pp.testing.torchrun import TINY_MODEL, launch

pytestmark = pytest.mark.multiproc

ITERS = 6
FLAGS = TINY_MODEL + ["--train-iters", str(ITERS), "--pipeline-schedule", "1f1b"]


def _refused(run, message: str) -> None:
    """The job failed with exit status 2 and the message, before the first step."""
    assert run.returncode != 0, run.describe()
    assert 2 in run.exit_codes().values(), run.describe()  # torchrun may SIGTERM the other rank
    assert message in run.stderr, run.describe()
    assert not os.path.exists(run.log_path), "an iteration ran before the refusal"


def _listing(directory) -> list[str]:
    return sorted(os.listdir(directory))


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """Uninterrupted run, checkpoints every 2 iterations (keep 2: iter 4 and 6 remain)."""
    tmp = tmp_path_factory.mktemp("base")
    run = launch(FLAGS + ["--save", str(tmp / "ckpt"), "--save-interval", "2"], nproc=2,
                 tmp_path=tmp, name="base")
    assert run.returncode == 0, run.describe()
    assert _listing(tmp / "ckpt") == ["iter_0000004", "iter_0000006", "latest"]
    return run, tmp / "ckpt"


def test_corrupted_rank_file_is_named_and_the_previous_checkpoint_resumes_exactly(base,
                                                                                  tmp_path):
    uninterrupted, saved = base
    ckpt = tmp_path / "ckpt"
    shutil.copytree(saved, ckpt)
    bad = ckpt / "iter_0000006" / "rank_00001.pt"
    data = bytearray(bad.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 4096] = bytes(b ^ 0xFF for b in data[middle:middle + 4096])
    bad.write_bytes(bytes(data))
    run = launch(FLAGS + ["--load", str(ckpt), "--save", str(ckpt)], nproc=2,
                 tmp_path=tmp_path, name="fallback")
    assert run.returncode == 0, run.describe()
    assert (f"warning: checkpoint iteration 6 is unusable: checkpoint file {bad} fails its "
            f"SHA-256 checksum") in run.stderr, run.describe()
    assert f"warning: falling back to iteration 4 ({ckpt / 'iter_0000004'})" in run.stderr
    assert f"resumed from {ckpt} at iteration 4 (exact)" in run.stdout, run.describe()
    assert [r["iteration"] for r in run.records()] == [5, 6]
    assert run.losses() == uninterrupted.losses()[4:], "resumed losses differ"
    # the bad checkpoint was moved aside, not deleted; iteration 6 was saved again
    assert _listing(ckpt) == ["iter_0000004", "iter_0000006", "iter_0000006.corrupt",
                              "latest"]
    assert (ckpt / "latest").read_text().strip() == "6"


def test_retention_never_destroys_a_newer_state(base, tmp_path):
    _, saved = base
    ckpt = tmp_path / "ckpt"
    shutil.copytree(saved, ckpt)
    before = {name: sorted(os.listdir(ckpt / name)) for name in ("iter_0000004",
                                                                  "iter_0000006")}
    # a fresh run pointed at the old --save directory is refused
    fresh = launch(FLAGS + ["--save", str(ckpt)], nproc=2, tmp_path=tmp_path, name="fresh")
    _refused(fresh, f"--save {ckpt} already holds checkpoints newer than iteration 0, where "
                    f"this run starts (iter_0000004, iter_0000006); refusing to overwrite or "
                    f"prune them. Resume from them with --load {ckpt}, or give a new --save "
                    f"directory")
    assert _listing(ckpt) == ["iter_0000004", "iter_0000006", "latest"]
    # `latest` deleted: refused, not a silent restart from iteration 0
    (ckpt / "latest").unlink()
    lost = launch(FLAGS + ["--load", str(ckpt), "--save", str(ckpt)], nproc=2,
                  tmp_path=tmp_path, name="lost")
    _refused(lost, f"--load {ckpt} holds checkpoints (iter_0000004, iter_0000006) but no "
                   f"'latest' file, so which one to resume is unknown")
    assert _listing(ckpt) == ["iter_0000004", "iter_0000006"]
    assert {name: sorted(os.listdir(ckpt / name)) for name in before} == before
    # resumed run saving every iteration with keep 2: it prunes only its own older ones
    (ckpt / "latest").write_text("6\n")
    run = launch(FLAGS + ["--load", str(ckpt), "--save", str(ckpt), "--train-iters", "9",
                          "--save-interval", "1", "--keep-checkpoints", "2"],
                 nproc=2, tmp_path=tmp_path, name="resumed")
    assert run.returncode == 0, run.describe()
    for iteration in (7, 8, 9):
        assert f"saved checkpoint {ckpt / f'iter_{iteration:07d}'}" in run.stdout
    assert _listing(ckpt) == ["iter_0000004", "iter_0000006", "iter_0000008", "iter_0000009",
                              "latest"]
    assert (ckpt / "latest").read_text().strip() == "9"


def test_load_of_a_missing_directory(base, tmp_path):
    uninterrupted, _ = base
    missing = tmp_path / "no-such-ckpt"
    run = launch(FLAGS + ["--load", str(missing)], nproc=2, tmp_path=tmp_path, name="missing")
    _refused(run, f"--load {missing} does not exist; fix --load, or pass --load-optional")
    optional = launch(FLAGS + ["--load", str(missing), "--load-optional", "--exit-interval",
                               "2"], nproc=2, tmp_path=tmp_path, name="optional")
    assert optional.returncode == 0, optional.describe()
    assert f"--load {missing} does not exist: training from scratch" in optional.stdout
    assert [r["iteration"] for r in optional.records()] == [1, 2]
    assert optional.losses() == uninterrupted.losses()[:2]


def test_resume_with_other_attention_heads_names_the_flag(base, tmp_path):
    _, saved = base
    heads = [("2" if previous == "--num-attention-heads" else flag)
             for previous, flag in zip([""] + FLAGS, FLAGS)]
    assert heads != FLAGS
    run = launch(heads + ["--load", str(saved)], nproc=2, tmp_path=tmp_path, name="heads")
    _refused(run, f"checkpoint {saved / 'iter_0000006'} holds another model "
                  f"(num_attention_heads: saved 4 vs now 2 (--num-attention-heads))")


def _make_read_only(directory) -> bool:
    if os.geteuid() != 0:
        os.chmod(directory, 0o555)
        return True
    # root ignores permission bits: the immutable attribute stops it (ext4, xfs, btrfs)
    return subprocess.run(["chattr", "+i", str(directory)], capture_output=True).returncode == 0


def test_read_only_save_dir_fails_before_the_first_step(tmp_path):
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    if not _make_read_only(read_only):
        pytest.skip("cannot make a directory read-only here (root without chattr +i)")
    try:
        run = launch(FLAGS + ["--save", str(read_only)], nproc=2, tmp_path=tmp_path,
                     name="read_only")
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(read_only)], check=True)
        else:
            os.chmod(read_only, 0o755)
    _refused(run, f"--save {read_only} is not writable by rank 0")
    assert os.listdir(read_only) == []
