"""A tied model (the default: embedding and output layer one weight) across pipeline sizes
(issue 53, item 5): saved at pp=1 it resumes at pp=2, where the last stage's output layer
starts as a copy of the embedding (weights and AdamW moments), and continues the run; the
pp=2 checkpoint (its copies still equal: a broken tie is refused at save) resumes at pp=1
and continues it too; ``--finetune`` at pp=2 starts from the pp=1 weights. The resharding
function itself is tested at pp=4 and for the bit-exact round trip in
tests/unit/training/test_resharding.py."""

import pytest

from odc_pp.testing.torchrun import TINY_MODEL, launch

pytestmark = pytest.mark.multiproc

TIED = [flag for flag in TINY_MODEL if flag != "--untie-embeddings-and-output-weights"]
FLAGS = TIED + ["--train-iters", "5", "--pipeline-schedule", "1f1b"]
PP2 = ["--pipeline-model-parallel-size", "2"]


def _close(got: list[float], want: list[float]) -> bool:
    # a tied model's two gradient sums (one weight at pp=1, two copies) round differently
    return len(got) == len(want) and all(abs(g - w) <= 1e-5 * abs(w) for g, w in zip(got, want))


def test_tied_model_moves_between_pipeline_sizes(tmp_path):
    reference = launch(FLAGS, nproc=1, tmp_path=tmp_path, name="reference")
    assert reference.returncode == 0, reference.describe()
    pp1, pp2 = str(tmp_path / "pp1"), str(tmp_path / "pp2")
    first = launch(FLAGS + ["--save", pp1, "--exit-interval", "2"], nproc=1,
                   tmp_path=tmp_path, name="first")
    assert first.returncode == 0, first.describe()
    second = launch(FLAGS + PP2 + ["--load", pp1, "--save", pp2, "--exit-interval", "4"],
                    nproc=2, tmp_path=tmp_path, name="second")
    assert second.returncode == 0, second.describe()
    assert "resharded (pp 1 -> 2" in second.stdout, second.stdout
    assert f"saved checkpoint {pp2}/iter_0000004" in second.stdout, second.stdout
    third = launch(FLAGS + ["--load", pp2], nproc=1, tmp_path=tmp_path, name="third")
    assert third.returncode == 0, third.describe()
    assert "resharded (pp 2 -> 1" in third.stdout, third.stdout
    losses = first.losses() + second.losses() + third.losses()
    assert _close(losses, reference.losses()), (losses, reference.losses())
    finetune = launch(TIED + PP2 + ["--train-iters", "1", "--load", pp1, "--finetune"],
                      nproc=2, tmp_path=tmp_path, name="finetune")
    assert finetune.returncode == 0, finetune.describe()
    assert "finetuning: weights of iteration 2" in finetune.stdout, finetune.stdout
