"""Uneven pipeline stages through ``pretrain_gpt.py``'s flags (Megatron's
--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers): a pp=2 run whose
first stage holds 1 of the 4 layers and the last 3 trains like the single-process run,
and its checkpoint resumes at pp=1 (resharded by global layer name) and continues it."""

import pytest

from odc_pp.testing.torchrun import TINY_MODEL, launch

pytestmark = pytest.mark.multiproc

FLAGS = TINY_MODEL + ["--train-iters", "4", "--pipeline-schedule", "1f1b"]
UNEVEN = ["--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers", "1",
          "--decoder-last-pipeline-num-layers", "3"]


def _close(got: list[float], want: list[float]) -> bool:
    return len(got) == len(want) and all(abs(g - w) <= 1e-5 * abs(w) for g, w in zip(got, want))


def test_uneven_checkpoint_resumes_at_pp1(tmp_path):
    reference = launch(FLAGS, nproc=1, tmp_path=tmp_path, name="reference")
    assert reference.returncode == 0, reference.describe()
    saved = str(tmp_path / "uneven")
    first = launch(FLAGS + UNEVEN + ["--save", saved, "--exit-interval", "2"], nproc=2,
                   tmp_path=tmp_path, name="first")
    assert first.returncode == 0, first.describe()
    assert f"saved checkpoint {saved}/iter_0000002" in first.stdout, first.stdout
    assert "decoder layers per virtual stage [1, 3]" in first.stdout, first.stdout
    second = launch(FLAGS + ["--load", saved], nproc=1, tmp_path=tmp_path, name="second")
    assert second.returncode == 0, second.describe()
    assert "resharded (pp 2 -> 1" in second.stdout, second.stdout
    losses = first.losses() + second.losses()
    assert _close(losses, reference.losses()), (losses, reference.losses())


def test_uneven_flags_are_checked_as_megatron(tmp_path):
    bad = launch(FLAGS + ["--pipeline-model-parallel-size", "2",
                          "--decoder-first-pipeline-num-layers", "1",
                          "--decoder-last-pipeline-num-layers", "1"],
                 nproc=2, tmp_path=tmp_path, name="bad")
    assert bad.returncode != 0
    assert "--decoder-first-pipeline-num-layers 1 and --decoder-last-pipeline-num-layers 1: " \
           "2 middle layers remain for 0 middle pipeline stages" in bad.stdout + bad.stderr, \
        bad.describe()


SIX = list(TINY_MODEL)
SIX[SIX.index("--num-layers") + 1] = "6"


@pytest.mark.parametrize("schedule", ["interleaved", "zbv"])
def test_two_chunk_families_train_uneven_stages_like_one_process(tmp_path, schedule):
    """Two chunks a rank, first stage 2 layers (1 a chunk), last stage 4 (2 a chunk)."""
    flags = SIX + ["--train-iters", "3"]
    reference = launch(flags, nproc=1, tmp_path=tmp_path, name="reference")
    assert reference.returncode == 0, reference.describe()
    uneven = launch(flags + ["--pipeline-schedule", schedule,
                             "--pipeline-model-parallel-size", "2",
                             "--decoder-first-pipeline-num-layers", "2",
                             "--decoder-last-pipeline-num-layers", "4"],
                    nproc=2, tmp_path=tmp_path, name=schedule)
    assert uneven.returncode == 0, uneven.describe()
    assert "decoder layers per virtual stage [1, 2, 1, 2]" in uneven.stdout, uneven.stdout
    assert _close(uneven.losses(), reference.losses()), (uneven.losses(), reference.losses())
