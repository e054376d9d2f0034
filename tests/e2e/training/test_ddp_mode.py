"""End-to-end ``--dp-mode ddp`` (Megatron's DDP + distributed optimizer): pretrain_gpt.py
through torchrun on CPU (gloo), tiny GPT in fp32; its losses equal ``odc``'s and
``collective``'s within 1e-6 at pp=2 x dp=2 ZB-V, tp=2 x dp=2, with packed rows, and when
resuming from an ``odc`` checkpoint."""

import pytest

from odc_pp.testing.torchrun import TINY_MODEL, launch

pytestmark = pytest.mark.multiproc

ITERS = 3
BASE = TINY_MODEL + ["--train-iters", str(ITERS), "--load-balance", "balanced"]
LAYOUTS = {
    "pp2_dp2_zbv": (4, ["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "zbv"]),
    "tp2_dp2": (4, ["--tensor-model-parallel-size", "2", "--pipeline-schedule", "1f1b"]),
    "dp2_packed": (2, ["--pack-sequences", "--max-tokens-per-microbatch", "96",
                       "--pipeline-schedule", "1f1b"]),
}


def _losses(flags, nproc, tmp_path, name):
    run = launch(flags, nproc=nproc, tmp_path=tmp_path, name=name, timeout=300)
    assert run.returncode == 0, f"{name}: {run.describe()}"
    losses = run.losses()
    assert len(losses) == ITERS, f"{name}: {len(losses)} logged iterations"
    return losses


def _assert_close(losses, reference, name, rtol=1e-6):
    assert len(losses) == len(reference), name
    for i, (a, b) in enumerate(zip(losses, reference)):
        assert abs(a - b) <= rtol * abs(b), f"{name}: iteration {i + 1}: {a} vs {b}"


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_ddp_matches_odc_and_collective(layout, tmp_path):
    nproc, flags = LAYOUTS[layout]
    runs = {mode: _losses(BASE + flags + ["--dp-mode", mode], nproc, tmp_path,
                          f"{layout}_{mode}")
            for mode in ("ddp", "odc", "collective")}
    _assert_close(runs["ddp"], runs["odc"], f"{layout}: ddp vs odc")
    _assert_close(runs["ddp"], runs["collective"], f"{layout}: ddp vs collective")


def test_ddp_resumes_from_an_odc_checkpoint(tmp_path):
    """odc saves at iteration 2; ddp loads it (optimizer shards resharded by name) and its
    iteration 3 equals the uninterrupted odc run's."""
    flags = BASE + ["--pipeline-schedule", "1f1b"]
    ckpt = str(tmp_path / "ckpt")
    whole = _losses(flags + ["--dp-mode", "odc"], 2, tmp_path, "odc_whole")
    first = launch(flags + ["--dp-mode", "odc", "--save", ckpt, "--exit-interval", "2"],
                   nproc=2, tmp_path=tmp_path, name="odc_first")
    assert first.returncode == 0, first.describe()
    second = launch(flags + ["--dp-mode", "ddp", "--load", ckpt], nproc=2,
                    tmp_path=tmp_path, name="ddp_second")
    assert second.returncode == 0, second.describe()
    resumed = second.losses()
    assert len(resumed) == 1, f"resumed run logged {len(resumed)} iterations"
    _assert_close(resumed, whole[2:], "ddp resumed from odc")
