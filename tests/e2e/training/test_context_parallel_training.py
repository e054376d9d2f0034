"""End-to-end context parallelism: pretrain_gpt.py through torchrun on CPU (gloo), tiny GPT
(fp32); every layout's logged losses equal the single-process run's within 1e-6 over 3
iterations (same seed, same mock data)."""

import pytest

from odc_pp.testing.torchrun import TINY_MODEL, launch
from .test_end_to_end import _assert_same_losses

pytestmark = pytest.mark.multiproc

ITERS = ["--train-iters", "3"]
CP2 = ["--context-parallel-size", "2"]
PP2 = ["--pipeline-model-parallel-size", "2"]
LAYOUTS = {
    "cp2": (2, CP2 + ["--pipeline-schedule", "1f1b"]),
    "cp2_a2a": (2, CP2 + ["--cp-comm-type", "a2a", "--pipeline-schedule", "1f1b"]),
    "cp2_pp2_1f1b": (4, CP2 + PP2 + ["--pipeline-schedule", "1f1b"]),
    # cp x pp x dp (ODC) under ZB-V, cp=4 x pp=2, and cp x tp (56 s each on 2 cores)
    "cp2_pp2_dp2_zbv": (8, CP2 + PP2 + ["--pipeline-schedule", "zbv"]),
    "cp4_pp2_zbv": (8, ["--context-parallel-size", "4"] + PP2 + ["--pipeline-schedule", "zbv"]),
    "cp2_tp2": (4, CP2 + ["--tensor-model-parallel-size", "2", "--pipeline-schedule", "1f1b"]),
}
PACKED = ["--pack-sequences", "--max-tokens-per-microbatch", "96", "--pipeline-schedule",
          "1f1b"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cp_reference")
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
    _assert_same_losses(run.losses(), reference, name, rtol=1e-6)


def test_packed_rows_match_single_process(tmp_path):
    """Packed rows: documents cross the chunks and ranks; the ring masks each pair with
    the whole rows' segment ids."""
    first = launch(TINY_MODEL + ITERS + PACKED, nproc=1, tmp_path=tmp_path, name="packed")
    assert first.returncode == 0, first.describe()
    run = launch(TINY_MODEL + ITERS + PACKED + CP2, nproc=2, tmp_path=tmp_path,
                 name="cp2_packed", timeout=300)
    assert run.returncode == 0, run.describe()
    _assert_same_losses(run.losses(), first.losses(), "cp2_packed", rtol=1e-6)


def test_world_not_divisible_by_cp_exits_naming_the_flag(tmp_path):
    run = launch(TINY_MODEL + ITERS + ["--context-parallel-size", "2"], nproc=3,
                 tmp_path=tmp_path, name="bad_cp", log=False, timeout=120)
    assert run.returncode != 0
    assert "--context-parallel-size 2" in run.stderr + run.stdout
