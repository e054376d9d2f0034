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
    # cp x pp x dp (ODC) under ZB-V and 1F1B, cp=4 x pp=2 (x dp=2: 16 ranks), and cp x tp
    # (56 s each on 2 cores)
    "cp2_pp2_dp2_zbv": (8, CP2 + PP2 + ["--pipeline-schedule", "zbv"]),
    "cp4_pp2_zbv": (8, ["--context-parallel-size", "4"] + PP2 + ["--pipeline-schedule", "zbv"]),
    "cp2_pp2_dp2_1f1b": (8, CP2 + PP2 + ["--pipeline-schedule", "1f1b"]),
    "cp4_pp2_dp2_zbv": (16, ["--context-parallel-size", "4"] + PP2 +
                        ["--pipeline-schedule", "zbv"]),
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


def test_long_document_cp2_pp2_halves_activation_memory(tmp_path):
    """A 4096-token document per sample (the issue asks 16K: the same at 4x the length,
    about 10 minutes on 2 cores), cp=2 x pp=2 against cp=1 x pp=2: the same losses within
    1e-6 and each rank's counted peak activations (--log-activation-memory) at most 0.55x
    (measured 0.50x: 16.3 vs 32.6 MB)."""
    import json

    import numpy as np

    rows = tmp_path / "rows.jsonl"
    generator = np.random.default_rng(0)
    with open(rows, "w") as handle:
        for _ in range(8):
            ids = generator.integers(1, 300, 4097).tolist()
            handle.write(json.dumps({"input_ids": ids}) + "\n")
    flags = list(TINY_MODEL)
    for name, value in (("--seq-length", "4096"), ("--global-batch-size", "2"),
                        ("--vocab-size", "320")):
        flags[flags.index(name) + 1] = value
    flags.remove("--mock-data")
    flags += ["--data-path", str(rows), "--tokenizer-type", "ByteLevelTokenizer",
              "--max-position-embeddings", "4096", "--train-iters", "2",
              "--attention-backend", "sdpa", "--log-activation-memory"] + PP2 + \
        ["--pipeline-schedule", "1f1b"]
    runs = {}
    for name, nproc, extra in (("cp1", 2, []), ("cp2", 4, CP2)):
        runs[name] = launch(flags + extra, nproc=nproc, tmp_path=tmp_path, name=name,
                            timeout=300)
        assert runs[name].returncode == 0, runs[name].describe()
    _assert_same_losses(runs["cp2"].losses(), runs["cp1"].losses(), "cp2_long", rtol=1e-6)
    peaks = [runs[name].records()[-1]["peak_activation_mb"] for name in ("cp1", "cp2")]
    assert peaks[0] and peaks[1] <= 0.55 * peaks[0], peaks
