"""tools/export_megatron.py for every model family the trainer builds (issue 51, item 2):
GPT (tied), Llama (RMSNorm, SwiGLU, GQA, Llama-3 RoPE scaling, untied), Qwen2 (qkv bias,
tied), Mistral (untied) and Qwen3 (q/k norms, head dim 16), each trained at pp=2 (1f1b) for 2 iterations with a
checkpoint at iteration 1. The export of iteration 1, loaded by ``dist_checkpointing``
into megatron-core's stock ``GPTModel`` built from the same arguments (its local layer
spec), gives our iteration-2 loss (computed with iteration 1's weights) within 1e-6;
the export leaves only ``iter_0000001`` and the tracker in its output directory."""

import json
import os
import subprocess
import sys

import pytest

from odc_pp.testing.torchrun import ROOT, launch

from .megatron_stock import HEADS, HIDDEN, LAYERS, SEQ, VOCAB
from .test_megatron_tied import _batches

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]

FLAGS = ["--num-layers", str(LAYERS), "--hidden-size", str(HIDDEN), "--num-attention-heads",
         str(HEADS), "--seq-length", str(SEQ), "--max-position-embeddings", str(SEQ),
         "--mock-data", "--vocab-size", str(VOCAB), "--global-batch-size", "4",
         "--micro-batch-size", "1", "--lr", "1e-2", "--min-lr", "1e-2", "--seed", "7",
         "--no-progress-bar", "--distributed-timeout-minutes", "1.5",
         # the stock model's loss is a plain forward: compare without dropout (keyed
         # dropout is odc-pp's own mask stream, not megatron-core's)
         "--hidden-dropout", "0", "--attention-dropout", "0"]
TOLERANCE = 1e-6
STOCK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "megatron_stock_families.py")
_LLAMA_FLAGS = ["--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear",
                "--position-embedding-type", "rope", "--group-query-attention",
                "--num-query-groups", "2", "--ffn-hidden-size", "48", "--norm-epsilon", "1e-6"]
_LLAMA_CONFIG = {"num_layers": LAYERS, "hidden_size": HIDDEN, "num_attention_heads": HEADS,
                 "normalization": "RMSNorm", "swiglu": True, "add_bias_linear": False,
                 "num_query_groups": 2, "ffn_hidden_size": 48, "layernorm_epsilon": 1e-6}
_MODEL = {"vocab_size": VOCAB, "max_sequence_length": SEQ}
_ROPE = {**_MODEL, "position_embedding_type": "rope"}

# family: (our flags, stock TransformerConfig keywords, stock GPTModel keywords)
FAMILIES = {
    "gpt": ([], {"num_layers": LAYERS, "hidden_size": HIDDEN, "num_attention_heads": HEADS,
                 "ffn_hidden_size": 4 * HIDDEN},
            {**_MODEL, "position_embedding_type": "learned_absolute",
             "share_embeddings_and_output_weights": True}),
    "llama": (_LLAMA_FLAGS + ["--rotary-base", "500000", "--use-rope-scaling",
                              "--rope-scaling-factor", "8",
                              "--untie-embeddings-and-output-weights"],
              _LLAMA_CONFIG,
              {**_ROPE, "rotary_base": 500000, "rope_scaling": True, "rope_scaling_factor": 8.0,
               "share_embeddings_and_output_weights": False}),
    "qwen2": (_LLAMA_FLAGS + ["--rotary-base", "1000000", "--add-qkv-bias"],
              {**_LLAMA_CONFIG, "add_qkv_bias": True},
              {**_ROPE, "rotary_base": 1000000, "share_embeddings_and_output_weights": True}),
    "mistral": (_LLAMA_FLAGS + ["--untie-embeddings-and-output-weights"], _LLAMA_CONFIG,
                {**_ROPE, "rotary_base": 10000, "share_embeddings_and_output_weights": False}),
    "qwen3": (_LLAMA_FLAGS + ["--rotary-base", "1000000", "--qk-layernorm", "--kv-channels",
                              "16"],
              {**_LLAMA_CONFIG, "qk_layernorm": True, "kv_channels": 16},
              {**_ROPE, "rotary_base": 1000000, "share_embeddings_and_output_weights": True}),
}


def _recorded_args(directory) -> dict:
    """The Megatron-LM arguments the export wrote into common.pt (those the stock model
    of these tests is built from; RoPE scaling has no weights, only this records it)."""
    from odc_pp.megatron.model_identity import read_megatron_args

    args = read_megatron_args(str(directory))
    return {key: args[key] for key in ("normalization", "swiglu", "add_bias_linear",
                                       "add_qkv_bias", "num_query_groups",
                                       "position_embedding_type", "rotary_base",
                                       "use_rope_scaling", "rope_scaling_factor",
                                       "untie_embeddings_and_output_weights")}


def _expected_args(config: dict, model: dict) -> dict:
    rope = model["position_embedding_type"] == "rope"
    return {"normalization": config.get("normalization", "LayerNorm"),
            "swiglu": config.get("swiglu", False),
            "add_bias_linear": config.get("add_bias_linear", True),
            "add_qkv_bias": config.get("add_qkv_bias", False),
            "num_query_groups": config.get("num_query_groups", HEADS),
            "position_embedding_type": model["position_embedding_type"],
            "rotary_base": model["rotary_base"] if rope else 10000.0,
            "use_rope_scaling": model.get("rope_scaling", False),
            "rope_scaling_factor": model.get("rope_scaling_factor", 8.0),
            "untie_embeddings_and_output_weights":
                not model["share_embeddings_and_output_weights"]}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_export_loads_into_the_stock_gptmodel_with_our_loss(family, tmp_path):
    import torch

    flags, config, model = FAMILIES[family]
    (tmp_path / "families.json").write_text(json.dumps({family: {"config": config,
                                                                 "model": model}}))
    torch.save(_batches(FLAGS + flags, (2,)), tmp_path / f"batches_{family}.pt")
    run = launch(FLAGS + flags + ["--pipeline-model-parallel-size", "2",
                                  "--pipeline-schedule", "1f1b", "--train-iters", "2",
                                  "--save", str(tmp_path / "ours"), "--save-interval", "1"],
                 nproc=2, tmp_path=tmp_path, name=f"pp2_{family}")
    assert run.returncode == 0, run.describe()
    ours = {record["iteration"]: record["loss"] for record in run.records()}
    output = tmp_path / "exported"
    done = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "export_megatron.py"),
                           "--load", str(tmp_path / "ours"), "--output", str(output),
                           "--iteration", "1"],
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert sorted(os.listdir(output)) == ["iter_0000001", "latest_checkpointed_iteration.txt"]
    assert _recorded_args(output / "iter_0000001") == _expected_args(config, model)
    stock = launch(["losses", str(tmp_path), family, str(output)], nproc=1, tmp_path=tmp_path,
                   name=f"stock_{family}", log=False, script=STOCK)
    assert stock.returncode == 0, stock.describe()
    report = json.loads((tmp_path / f"stock_{family}.json").read_text())
    assert report["iteration"] == 1
    assert abs(ours[2] - report["losses"]["2"]) <= TOLERANCE, (family, ours, report)
