"""The tied Megatron round trip (issue 33): megatron-core's own tied ``GPTModel``
(``share_embeddings_and_output_weights=True``: Megatron-LM without
``--untie-embeddings-and-output-weights``) is saved with ``dist_checkpointing``;
pretrain_gpt.py, tied by default as Megatron, loads it at pp=2 x dp=2 (``--load
--finetune``: the embedding and the last stage's output-layer copy start from the one
tied weight) and trains 4 iterations. The stock model's loss equals ours at iteration 1;
the run's copies stay bitwise equal; ``tools/export_megatron.py`` of iteration 3 writes no
output layer, and the stock tied model loaded from it gives our iteration-4 loss (computed
with iteration 3's weights), each within 1e-6."""

import json
import os
import subprocess
import sys

import pytest
import torch

from odc_pp.testing.torchrun import ROOT, launch

from .megatron_stock import HEADS, HIDDEN, LAYERS, SEQ, VOCAB

pytestmark = pytest.mark.multiproc

FLAGS = ["--num-layers", str(LAYERS), "--hidden-size", str(HIDDEN), "--num-attention-heads",
         str(HEADS), "--seq-length", str(SEQ), "--max-position-embeddings", str(SEQ),
         "--mock-data", "--vocab-size", str(VOCAB), "--global-batch-size", "4",
         "--micro-batch-size", "1", "--lr", "1e-2", "--min-lr", "1e-2", "--seed", "7",
         "--no-progress-bar", "--distributed-timeout-minutes", "1.5"]
TOLERANCE = 1e-6
STOCK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "megatron_stock_tied.py")
OUTPUT, EMBEDDING = "model.output_layer.weight", "model.embedding.word_embeddings.weight"


def _batches(flags, iterations) -> dict:
    """{iteration: the samples of its global batch} as the stock script reads them."""
    from odc_pp.training.arguments import parse_args
    from odc_pp.training.data_plan import build_source

    args = parse_args(flags)
    source, _ = build_source(args)
    size = args.data.global_batch_size
    out = {}
    for iteration in iterations:
        out[iteration] = []
        for index in range((iteration - 1) * size, iteration * size):
            sample = source[index]
            positions = getattr(sample, "position_ids", None)  # Megatron-built samples
            out[iteration].append({
                "tokens": torch.from_numpy(sample.tokens),
                "loss_mask": torch.from_numpy(sample.loss_mask),
                "position_ids": None if positions is None else torch.from_numpy(positions)})
    return out


def _stock_losses(root, save_dir) -> dict:
    done = launch(["losses", str(root), str(save_dir)], nproc=1, tmp_path=root,
                  name=f"stock_{os.path.basename(save_dir)}", log=False, script=STOCK)
    assert done.returncode == 0, done.describe()
    return json.loads((root / f"{os.path.basename(save_dir)}.json").read_text())


@pytest.fixture(scope="module")
def tied_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("megatron_tied")
    saved = launch(["save", str(root)], nproc=1, tmp_path=root, name="save", log=False,
                   script=STOCK)
    assert saved.returncode == 0, saved.describe()
    torch.save(_batches(FLAGS, (1, 4)), root / "batches.pt")
    # the stock model's losses are forward-only (no dropout): train ours without dropout
    run = launch(FLAGS + ["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "1f1b",
                          "--load", str(root / "megatron"), "--finetune", "--train-iters", "4",
                          "--save", str(root / "ours"), "--save-interval", "3",
                          "--hidden-dropout", "0", "--attention-dropout", "0"],
                 nproc=4, tmp_path=root, name="pp2_dp2")
    assert run.returncode == 0, run.describe()
    return root, {record["iteration"]: record["loss"] for record in run.records()}


def test_iteration_1_loss_is_the_stock_tied_models(tied_run):
    root, ours = tied_run
    assert sorted(ours) == [1, 2, 3, 4]
    stock = _stock_losses(root, root / "megatron")
    assert abs(ours[1] - stock["losses"]["1"]) <= TOLERANCE, (ours[1], stock)
    assert abs(ours[4] - stock["losses"]["4"]) > 100 * TOLERANCE  # training moved the weights


def test_the_copies_stay_one_weight(tied_run):
    root, _ = tied_run
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    from export_checkpoint import export

    for iteration in (3, 4):
        _, state = export(str(root / "ours"), iteration)
        assert OUTPUT in state  # the last stage's copy, saved
        assert torch.equal(state[OUTPUT], state[EMBEDDING]), iteration
    meta = json.loads((root / "ours" / "iter_0000004" / "meta.json").read_text())
    assert meta["tie_embeddings"] is True


def test_export_loads_into_the_stock_tied_model_with_our_loss(tied_run):
    root, ours = tied_run
    done = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "export_megatron.py"),
                           "--load", str(root / "ours"), "--output", str(root / "exported"),
                           "--iteration", "3"],
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    from odc_pp.megatron.dist_ckpt import read_megatron_tensors

    names = set(read_megatron_tensors(str(root / "exported" / "iter_0000003")))
    assert "output_layer.weight" not in names and EMBEDDING.removeprefix("model.") in names
    stock = _stock_losses(root, root / "exported")
    assert stock["iteration"] == 3
    assert abs(ours[4] - stock["losses"]["4"]) <= TOLERANCE, (ours[4], stock)
