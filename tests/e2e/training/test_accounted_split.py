"""Megatron-LM's --account-for-embedding-in-pipeline-split /
--account-for-loss-in-pipeline-split through ``pretrain_gpt.py``'s flags: 2 layers over 2
ranks x 2 chunks hold 0, 1, 1, 0 decoder layers (the first chunk the embedding alone, the
last the loss alone); interleaved and zbv train like the single process, and a checkpoint
saved so resumes on another layout (1F1B, equal stages) and continues the run."""

import pytest

from odc_pp.testing.torchrun import TINY_MODEL, launch

pytestmark = pytest.mark.multiproc

TWO = list(TINY_MODEL)
TWO[TWO.index("--num-layers") + 1] = "2"
FLAGS = TWO + ["--train-iters", "4"]
ACCOUNTED = ["--pipeline-model-parallel-size", "2", "--account-for-embedding-in-pipeline-split",
             "--account-for-loss-in-pipeline-split"]


def _close(got: list[float], want: list[float]) -> bool:
    return len(got) == len(want) and all(abs(g - w) <= 1e-5 * abs(w) for g, w in zip(got, want))


@pytest.mark.parametrize("schedule", ["interleaved", "zbv"])
def test_accounted_split_trains_like_one_process(tmp_path, schedule):
    reference = launch(FLAGS, nproc=1, tmp_path=tmp_path, name="reference")
    assert reference.returncode == 0, reference.describe()
    run = launch(FLAGS + ACCOUNTED + ["--pipeline-schedule", schedule], nproc=2,
                 tmp_path=tmp_path, name=schedule)
    assert run.returncode == 0, run.describe()
    assert "decoder layers per virtual stage [0, 1, 1, 0]" in run.stdout, run.stdout
    assert _close(run.losses(), reference.losses()), (run.losses(), reference.losses())


def test_accounted_checkpoint_resumes_on_equal_stages(tmp_path):
    reference = launch(FLAGS, nproc=1, tmp_path=tmp_path, name="reference")
    assert reference.returncode == 0, reference.describe()
    saved = str(tmp_path / "accounted")
    first = launch(FLAGS + ACCOUNTED + ["--pipeline-schedule", "interleaved", "--save", saved,
                                        "--exit-interval", "2"],
                   nproc=2, tmp_path=tmp_path, name="first")
    assert first.returncode == 0, first.describe()
    assert f"saved checkpoint {saved}/iter_0000002" in first.stdout, first.stdout
    second = launch(FLAGS + ["--pipeline-model-parallel-size", "2", "--pipeline-schedule",
                             "1f1b", "--load", saved], nproc=2, tmp_path=tmp_path, name="second")
    assert second.returncode == 0, second.describe()
    assert "account_for_embedding_in_pipeline_split True -> False" in second.stdout, \
        second.stdout
    losses = first.losses() + second.losses()
    assert _close(losses, reference.losses()), (losses, reference.losses())


def test_accounted_split_refused_as_megatron_refuses(tmp_path):
    bad = launch(TWO + ["--train-iters", "1", "--pipeline-model-parallel-size", "2",
                        "--account-for-loss-in-pipeline-split",
                        "--decoder-first-pipeline-num-layers", "1"],
                 nproc=2, tmp_path=tmp_path, name="bad")
    assert bad.returncode != 0
    assert "--account-for-loss-in-pipeline-split cannot be combined with " \
           "--decoder-first-pipeline-num-layers" in bad.stdout + bad.stderr, bad.describe()
