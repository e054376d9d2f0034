"""--rampup-batch-size end to end (dp=2, one sample per microbatch): each iteration runs the
ramp's global batch -- the microbatches over both replicas add up to it -- and a run resumed
from iteration 3's checkpoint continues the ramp where it was."""

import pytest

from odc_pp.testing.torchrun import TINY_MODEL, launch
from odc_pp.training.rampup import BatchRampup

pytestmark = pytest.mark.multiproc

RAMP = ["--rampup-batch-size", "2", "2", "12", "--load-balance", "none",
        "--train-iters", "6"]  # TINY_MODEL: --global-batch-size 8, --micro-batch-size 1


def test_rampup_runs_the_ramp_and_resumes_it(tmp_path):
    ramp = BatchRampup(start=2, increment=2, samples=12, global_batch_size=8)
    expected = [ramp.batch_size_of(i) for i in range(6)]
    assert expected == [2, 2, 4, 6, 8, 8]
    save = str(tmp_path / "ckpt")
    first = launch(TINY_MODEL + RAMP + ["--save", save, "--exit-interval", "3"], nproc=2,
                   tmp_path=tmp_path, name="ramp")
    assert first.returncode == 0, first.describe()
    resumed = launch(TINY_MODEL + RAMP + ["--load", save], nproc=2, tmp_path=tmp_path,
                     name="ramp_resumed")
    assert resumed.returncode == 0, resumed.describe()
    records = first.records() + resumed.records()
    assert [r["iteration"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert [sum(r["microbatches_per_replica"]) for r in records] == expected
    assert [r["global_batch_size"] for r in records] == expected
    assert [r["consumed_samples"] for r in records] == [2, 4, 8, 14, 22, 30]
    assert "consumed samples: 8 | global batch size: 4" in first.stdout
