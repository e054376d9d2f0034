"""The data position on resume (issue 53, item 1): a checkpoint records the samples consumed
and a resumed run continues from them whatever its batch flags or data-parallel size, as
Megatron continues from ``consumed_train_samples``. With --lr 0 the weights never change,
so an iteration's loss is a function of its samples alone: the resumed run's losses must be
those of the samples that follow the checkpoint's, computed from a reference run at
--global-batch-size 4 (token-weighted means of its batches)."""

import pytest

from odc_pp.testing.torchrun import TINY_MODEL, launch
from odc_pp.training.arguments import parse_args
from odc_pp.training.data_plan import build_source

pytestmark = pytest.mark.multiproc

FROZEN = [f for f in TINY_MODEL] + ["--lr", "0", "--min-lr", "0", "--pipeline-schedule",
                                    "1f1b", "--load-balance", "none"]


def _gbs(size: int) -> list[str]:
    flags = list(FROZEN)
    flags[flags.index("--global-batch-size") + 1] = str(size)
    return flags


def _expected(reference: list[float], tokens: list[float], first: int, size: int) -> float:
    """The loss of samples first .. first + size - 1 from the reference's batches of 4."""
    batches = range(first // 4, (first + size) // 4)
    total = sum(tokens[b] for b in batches)
    return sum(reference[b] * tokens[b] for b in batches) / total


def test_resume_continues_from_the_consumed_samples(tmp_path):
    flags4 = _gbs(4)
    source, _ = build_source(parse_args(flags4 + ["--train-iters", "12"]))
    tokens = [float(sum(source[i].num_loss_tokens for i in range(4 * b, 4 * b + 4)))
              for b in range(12)]
    reference = launch(flags4 + ["--train-iters", "12"], nproc=1, tmp_path=tmp_path,
                       name="reference").losses()
    assert len(reference) == 12
    # saved at --global-batch-size 4, iteration 5: 20 samples; resumed at 8 on dp=2
    ckpt = str(tmp_path / "gbs4")
    first = launch(flags4 + ["--train-iters", "12", "--save", ckpt, "--exit-interval", "5"],
                   nproc=1, tmp_path=tmp_path, name="gbs4")
    assert first.returncode == 0, first.describe()
    resumed = launch(_gbs(8) + ["--train-iters", "7", "--load", ckpt], nproc=2,
                     tmp_path=tmp_path, name="gbs8")
    assert resumed.returncode == 0, resumed.describe()
    assert "data: iteration 5 continues from sample 20 (the samples the checkpoint records " \
           "as consumed); global batch 4 -> 8 from here on (--global-batch-size 4 -> 8)" \
        in resumed.stdout, resumed.stdout
    assert [r["consumed_samples"] for r in resumed.records()] == [28, 36]
    for got, first_sample in zip(resumed.losses(), (20, 28)):
        want = _expected(reference, tokens, first_sample, 8)
        assert abs(got - want) <= 1e-5 * want, (resumed.losses(), first_sample, want)
    # a mid-ramp checkpoint (batches 2, 2, 4: 8 samples) resumed without its ramp
    ramp = str(tmp_path / "ramp")
    ramped = launch(_gbs(8) + ["--rampup-batch-size", "2", "2", "12", "--train-iters", "6",
                               "--save", ramp, "--exit-interval", "3"],
                    nproc=1, tmp_path=tmp_path, name="ramp")
    assert ramped.returncode == 0, ramped.describe()
    unramped = launch(flags4 + ["--train-iters", "5", "--load", ramp], nproc=1,
                      tmp_path=tmp_path, name="unramped")
    assert unramped.returncode == 0, unramped.describe()
    assert "continues from sample 8 " in unramped.stdout, unramped.stdout
    for got, batch in zip(unramped.losses(), (2, 3)):  # samples 8-11, 12-15
        assert abs(got - reference[batch]) <= 1e-5 * reference[batch], unramped.losses()
    # skipping is explicit: --override-consumed-samples
    skipped = launch(flags4 + ["--train-iters", "6", "--load", ckpt,
                               "--override-consumed-samples", "32"],
                     nproc=1, tmp_path=tmp_path, name="skipped")
    assert skipped.returncode == 0, skipped.describe()
    assert "samples 20-31 are skipped" in skipped.stdout, skipped.stdout
    assert abs(skipped.losses()[0] - reference[8]) <= 1e-5 * reference[8]
