"""Dropout 0.1 (Megatron's default) trains the same model in every layout.

pretrain_gpt.py through the launcher on CPU (gloo), the tiny GPT in fp32, four
iterations with --hidden-dropout 0.1 --attention-dropout 0.1: the single-process run
(pp=1 = dp=1 = tp=1) and pp=2 ZB-V, dp=2 ODC, tp=2 and tp=2 with sequence parallelism
(each two ranks) give the same losses -- pp bitwise, dp and tp within the 1e-5 of the
parity tests (their gradient sums and all-reduces add in another order, as without
dropout) -- and so do pp=2 ZB-V with --recompute-lgd or full recompute (bitwise) and
context parallelism 2 (ring and all-to-all, 1e-5), because every
mask is keyed by (seed, global sample, token offset, layer, site), not drawn per rank in
execution order (odc_pp/megatron/dropout.py). The same run without the flags is the
same run (0.1 is the default); with --hidden-dropout 0 --attention-dropout 0 the losses
differ (dropout is on). A run saved at iteration 2 and resumed gives iterations 3..4
bitwise."""

import pytest

from odc_pp.testing.torchrun import TINY_MODEL, launch
from .test_end_to_end import _assert_same_losses

pytestmark = pytest.mark.multiproc

ITERS = ["--train-iters", "4", "--clip-grad", "0"]
"""No clipping: the clip factor divides by a gradient norm whose sum over stages rounds
differently per layout (dropout or not), which would hide pp's bitwise equality."""
DROPOUT = ["--hidden-dropout", "0.1", "--attention-dropout", "0.1"]
NO_DROPOUT = ["--hidden-dropout", "0", "--attention-dropout", "0"]
SINGLE = ["--pipeline-schedule", "1f1b"]
TP2 = ["--tensor-model-parallel-size", "2", "--pipeline-schedule", "1f1b"]
LAYOUTS = {  # name: (processes, flags, bitwise)
    "pp2_zbv": (2, ["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "zbv"],
                True),
    "dp2_odc": (2, ["--dp-mode", "odc", "--pipeline-schedule", "1f1b"], False),
    "tp2": (2, TP2, False),
    "tp2_sp": (2, TP2 + ["--sequence-parallel"], False),
    # beyond the six: recompute redraws nothing, context parallelism keys its blocks
    "pp2_zbv_recompute_lgd": (2, ["--pipeline-model-parallel-size", "2",
                                  "--pipeline-schedule", "zbv", "--recompute-lgd"], True),
    "pp2_zbv_recompute_full": (2, ["--pipeline-model-parallel-size", "2",
                                   "--pipeline-schedule", "zbv", "--recompute-granularity",
                                   "full", "--recompute-method", "uniform",
                                   "--recompute-num-layers", "1"], True),
    "cp2_p2p": (2, ["--context-parallel-size", "2", "--pipeline-schedule", "1f1b"], False),
    "cp2_a2a": (2, ["--context-parallel-size", "2", "--cp-comm-type", "a2a",
                    "--pipeline-schedule", "1f1b"], False),
}


def _run(flags, nproc, tmp_path, name):
    run = launch(TINY_MODEL + ITERS + flags, nproc=nproc, tmp_path=tmp_path, name=name,
                 timeout=300)
    assert run.returncode == 0, f"{name}: {run.describe()}"
    return run.losses()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """pp=1 x dp=1 x tp=1 with dropout 0.1."""
    return _run(DROPOUT + SINGLE, 1, tmp_path_factory.mktemp("dropout_ref"), "reference")


def test_dropout_is_on_by_default(reference, tmp_path):
    default = _run(SINGLE, 1, tmp_path, "default")
    assert default == reference, "Megatron's default dropout (0.1) is not the default"
    without = _run(NO_DROPOUT + SINGLE, 1, tmp_path, "no_dropout")
    assert len(without) == len(reference) == 4
    assert all(a != b for a, b in zip(without, reference)), (without, reference)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_dropout_layout_gives_the_same_losses(name, reference, tmp_path):
    nproc, flags, bitwise = LAYOUTS[name]
    losses = _run(DROPOUT + flags, nproc, tmp_path, name)
    if bitwise:
        assert losses == reference, f"{name}: {losses} vs reference {reference}"
    else:
        _assert_same_losses(losses, reference, name)


def test_dropout_resume_is_exact(reference, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    first = _run(DROPOUT + SINGLE + ["--save", ckpt, "--exit-interval", "2"], 1, tmp_path,
                 "first")
    second = _run(DROPOUT + SINGLE + ["--load", ckpt], 1, tmp_path, "second")
    assert first + second == reference, (first, second, reference)
