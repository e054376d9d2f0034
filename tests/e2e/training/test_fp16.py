"""--fp16 end to end: fp16 compute on CPU with Megatron's dynamic loss scaling over pp=2.
An inf injected into the last rank's gradients at iteration 3 is an overflow on one rank:
every rank skips that step (the weights are unchanged by it), the scale halves (hysteresis
1), and a run resumed from iteration 3's checkpoint goes on at the halved scale."""

import pytest
import torch

from odc_pp.testing.torchrun import FAULTS, TINY_MODEL, launch
from odc_pp.training.checkpoint.checkpointing import checkpoint_dir, load_rank_state

pytestmark = pytest.mark.multiproc

FP16 = ["--fp16", "--initial-loss-scale", "1024", "--hysteresis", "1",
        "--loss-scale-window", "3", "--pipeline-model-parallel-size", "2",
        "--train-iters", "5"]


def test_fp16_overflow_skips_one_step_and_resume_keeps_the_scale(tmp_path):
    save = str(tmp_path / "ckpt")
    first = launch(TINY_MODEL + FP16 + ["--inject-nonfinite-grad-iter", "3", "--save", save,
                                        "--save-interval", "1", "--exit-interval", "3"],
                   nproc=2, tmp_path=tmp_path, name="fp16", entry=FAULTS)
    assert first.returncode == 0, first.describe()
    records = first.records()
    assert [r["skipped"] for r in records] == [False, False, True]
    assert [r["loss_scale"] for r in records] == [1024.0, 1024.0, 512.0]
    assert "loss scale: 512.0 | number of skipped iterations:   1" in first.stdout
    for rank in (0, 1):  # the overflow was on rank 1 only: both stages kept their weights
        before = load_rank_state(checkpoint_dir(save, 2), rank)
        after = load_rank_state(checkpoint_dir(save, 3), rank)
        for key in ("master", "exp_avg", "exp_avg_sq"):
            assert all(torch.equal(a, b) for a, b in zip(before["optimizer"][key],
                                                          after["optimizer"][key])), key
        assert after["loss_scaler"] == {"scale": 512.0, "growth_tracker": 0,
                                        "hysteresis_tracker": 0}
        assert before["optimizer"]["master"][0].dtype is torch.float32  # fp32 masters
    resumed = launch(TINY_MODEL + FP16 + ["--load", save], nproc=2, tmp_path=tmp_path,
                     name="fp16_resumed")
    assert resumed.returncode == 0, resumed.describe()
    records = resumed.records()
    assert [r["iteration"] for r in records] == [4, 5]
    # a fresh scaler would log 1024 and grow to 2048 at iteration 5 (window 3)
    assert [r["loss_scale"] for r in records] == [512.0, 512.0]
    assert all(r["skipped"] is False and r["loss"] < 5 for r in records)
