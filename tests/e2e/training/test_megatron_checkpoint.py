"""Megatron-LM checkpoints (megatron-core dist_checkpointing, torch_dist) in and out.

In: a tiny GPTModel built with megatron-core alone is saved with ``dist_checkpointing``;
pretrain_gpt.py loads it at pp=2 x dp=2 (``--load``, ``--lr 0``), and the model it saves
gives the stock model's logits (fp32, <= 1e-6). Out: ``tools/export_megatron.py`` writes
that run's checkpoint as torch_dist, and ``dist_checkpointing.load`` reads it into a stock
GPTModel at tp=2, pp=1 (another layout than the pp=2 run), which gives the same logits.
On CPU megatron's torch_dist writer needs :func:`odc_pp.megatron.compat.cpu_dist_checkpointing`.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from odc_pp.testing.launch import LaunchConfig, run_workers
from odc_pp.testing.torchrun import ROOT, launch

from .megatron_stock import HEADS, HIDDEN, LAYERS, SEQ, VOCAB

pytestmark = pytest.mark.multiproc

FLAGS = ["--num-layers", str(LAYERS), "--hidden-size", str(HIDDEN), "--num-attention-heads",
         str(HEADS), "--seq-length", str(SEQ), "--max-position-embeddings", str(SEQ),
         "--mock-data", "--vocab-size", str(VOCAB), "--global-batch-size", "4",
         "--micro-batch-size", "1", "--lr", "0", "--min-lr", "0", "--seed", "7",
         "--no-progress-bar", "--distributed-timeout-minutes", "1.5",
         "--untie-embeddings-and-output-weights"]  # megatron_stock.py's model is untied
TOLERANCE = 1e-6
STOCK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "megatron_stock.py")


def ours_worker(rank, world_size, root):
    """Our saved pp=2 x dp=2 checkpoint, reassembled, as one chunk: its logits."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    from export_checkpoint import export

    from odc_pp.data import Microbatch
    from odc_pp.training.distributed import standalone_process_groups
    from odc_pp.megatron.model import ModelConfig, build_chunks

    _, state = export(os.path.join(root, "ours"))
    config = ModelConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_layers=LAYERS,
                         num_attention_heads=HEADS, max_sequence_length=SEQ)
    (chunk,) = build_chunks(config, pp_rank=0, pp_size=1,
                            process_groups=standalone_process_groups())
    params = dict(chunk.global_named_parameters())
    assert sorted(params) == sorted(state)
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(state[name])
        reference = torch.load(os.path.join(root, "reference.pt"))
        logits = chunk.logits_or_hidden(None, Microbatch(tokens=reference["tokens"]))
    error = float((logits - reference["logits"]).abs().max())
    with open(os.path.join(root, "ours.json"), "w") as handle:
        json.dump({"max_abs_error": error}, handle)


@pytest.fixture(scope="module")
def loaded_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("megatron_in")
    saved = launch(["save", str(root)], nproc=1, tmp_path=root, name="save", log=False,
                   script=STOCK)
    assert saved.returncode == 0, saved.describe()
    run = launch(FLAGS + ["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "1f1b",
                          "--load", str(root / "megatron"), "--train-iters", "6",
                          "--save", str(root / "ours")],
                 nproc=4, tmp_path=root, name="pp2_dp2")
    assert run.returncode == 0, run.describe()
    return root, run


def test_megatron_checkpoint_loads_at_pp2_dp2_with_the_same_logits(loaded_run):
    root, run = loaded_run
    assert "resumed from" in run.stdout and "weights only" in run.stdout, run.stdout[-2000:]
    assert "optimizer state skipped" in run.stdout
    assert [r["iteration"] for r in run.records()] == [6]  # continued after iteration 5
    run_workers(ours_worker, 1, str(root), config=LaunchConfig(timeout_s=180))
    report = json.loads((root / "ours.json").read_text())
    assert report["max_abs_error"] <= TOLERANCE, report


def test_export_loads_into_a_stock_gptmodel_at_tp2(loaded_run):
    root, _ = loaded_run
    done = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "export_megatron.py"),
                           "--load", str(root / "ours"), "--output", str(root / "exported")],
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "iteration 6" in done.stdout
    loaded = launch(["load_tp2", str(root)], nproc=2, tmp_path=root, name="load_tp2",
                    log=False, script=STOCK)
    assert loaded.returncode == 0, loaded.describe()
    report = json.loads((root / "stock_tp2.json").read_text())
    assert report["max_abs_error"] <= TOLERANCE, report


def test_a_megatron_checkpoint_of_another_model_is_named(loaded_run, tmp_path):
    root, _ = loaded_run
    run = launch(FLAGS[:1] + ["2"] + FLAGS[2:] + ["--load", str(root / "megatron"),
                                                  "--train-iters", "6"],
                 nproc=1, tmp_path=tmp_path, name="other_model")
    assert run.returncode != 0
    assert "stacks 4 layers; the model has 2 (--num-layers)" in run.stderr + run.stdout, \
        run.describe()
