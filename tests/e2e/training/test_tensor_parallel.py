"""End-to-end tensor (and sequence) parallelism: pretrain_gpt.py through torchrun on CPU
(gloo), tiny GPT; every layout's losses equal the single-process run's (fp32, 1e-5)."""

import pytest

from odc_pp.testing.torchrun import TINY_MODEL, launch
from .test_end_to_end import _assert_same_losses

pytestmark = pytest.mark.multiproc

ITERS = ["--train-iters", "4"]
TP2 = ["--tensor-model-parallel-size", "2"]
SP = ["--sequence-parallel"]
LAYOUTS = {
    "tp2": (2, TP2 + ["--pipeline-schedule", "1f1b"]),
    "tp2_sp": (2, TP2 + SP + ["--pipeline-schedule", "zb-h1"]),
    "tp2_sp_pp2_zbv": (4, TP2 + SP + ["--pipeline-model-parallel-size", "2",
                                      "--pipeline-schedule", "zbv"]),
    "tp2_sp_dp2_odc": (4, TP2 + SP + ["--dp-mode", "odc", "--pipeline-schedule", "1f1b"]),
    # 8 processes: tp 2 x pp 2 x dp 2, ZB-H1 with LB-Mini over ODC
    "tp2_pp2_dp2": (8, TP2 + ["--pipeline-model-parallel-size", "2", "--pipeline-schedule",
                              "zb-h1", "--dp-mode", "odc", "--load-balance", "lb-mini"]),
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tp_reference")
    run = launch(TINY_MODEL + ITERS + ["--pipeline-schedule", "1f1b"], nproc=1,
                 tmp_path=tmp, name="reference")
    assert run.returncode == 0, run.describe()
    return run.losses()


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_matches_single_process(name, reference, tmp_path):
    nproc, flags = LAYOUTS[name]
    run = launch(TINY_MODEL + ITERS + flags, nproc=nproc, tmp_path=tmp_path, name=name,
                 timeout=300)
    assert run.returncode == 0, f"{name}: {run.describe()}"
    _assert_same_losses(run.losses(), reference, name)


@pytest.mark.parametrize("saved,resumed", [
    (["--pipeline-schedule", "1f1b"], TP2 + SP + ["--pipeline-schedule", "zb-h1"]),
    (TP2 + SP + ["--pipeline-schedule", "zb-h1"], ["--pipeline-schedule", "1f1b"]),
], ids=["tp1_to_tp2", "tp2_to_tp1"])
def test_resume_across_tp_sizes_continues_the_loss_curve(saved, resumed, reference,
                                                         tmp_path):
    """Saved at iteration 2 under one tp size, resumed under the other: the optimizer
    state is put back together from the tp shards and cut for the new size (resharding by
    name), and iterations 3..4 continue the single-process curve to rounding."""
    ckpt = str(tmp_path / "ckpt")
    saved_nproc, resumed_nproc = (2 if "--tensor-model-parallel-size" in flags else 1
                                  for flags in (saved, resumed))
    first = launch(TINY_MODEL + ITERS + saved + ["--save", ckpt, "--exit-interval", "2"],
                   nproc=saved_nproc, tmp_path=tmp_path, name="first")
    assert first.returncode == 0, first.describe()
    second = launch(TINY_MODEL + ITERS + resumed + ["--load", ckpt], nproc=resumed_nproc,
                    tmp_path=tmp_path, name="second")
    assert second.returncode == 0, second.describe()
    assert "resharded (" in second.stdout and "tp " in second.stdout, second.stdout
    assert [r["iteration"] for r in second.records()] == [3, 4]
    _assert_same_losses(first.losses() + second.losses(), reference, "resumed")


def test_bad_tp_layout_exits_naming_the_flag(tmp_path):
    run = launch(TINY_MODEL + ITERS + ["--tensor-model-parallel-size", "3"], nproc=3,
                 tmp_path=tmp_path, name="bad_tp", log=False, timeout=120)
    assert run.returncode != 0
    assert "--tensor-model-parallel-size 3" in run.stderr + run.stdout
