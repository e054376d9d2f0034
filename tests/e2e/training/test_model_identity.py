"""Loads verify the model, not only shapes (odc_pp.megatron.model_identity).

Tiny Megatron torch_dist checkpoints are written with the existing saver
(``save_megatron_checkpoint``, ``args`` as Megatron-LM writes them, or none as megatron-core
alone writes) in one subprocess, which then runs the torch_dist load's identity check
(``check_megatron_identity``) for each set of flags: a run of this file as a script
(``python test_model_identity.py ROOT``) does both, because building the model needs
``torch.distributed``. Two pretrain_gpt.py runs show the exit status and the
``--finetune`` override end to end. Hugging Face directories: tensors no parameter is
built from are errors naming the flag (load_hf_weights).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
SIZE = ["--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "4",
        "--seq-length", "16", "--max-position-embeddings", "16", "--vocab-size", "64"]
UNTIED = ["--untie-embeddings-and-output-weights"]  # the "gpt" and "bare" checkpoints
# flags of each load -> (checkpoint, extra flags)
CASES = {
    "same": ("gpt", UNTIED),
    "same_bare": ("bare", UNTIED),
    "same_tied": ("tied", []),  # tied by default, as Megatron
    "heads": ("gpt", UNTIED + ["--num-attention-heads", "8"]),
    "heads_bare": ("bare", UNTIED + ["--num-attention-heads", "8"]),
    "no_bias": ("gpt", UNTIED + ["--disable-bias-linear"]),
    "rmsnorm": ("gpt", UNTIED + ["--normalization", "RMSNorm"]),
    "rope": ("gpt", UNTIED + ["--position-embedding-type", "rope"]),
    "rope_bare": ("bare", UNTIED + ["--position-embedding-type", "rope"]),
    "tied_into_untied": ("tied", UNTIED),
    "untied_into_tied": ("gpt", []),
    "tied_finetune": ("tied", UNTIED + ["--finetune"]),
    "no_bias_finetune": ("gpt", UNTIED + ["--disable-bias-linear", "--finetune"]),
}


def _save_all(root: str) -> None:
    """Subprocess: the checkpoints, then the identity check of every case into
    ``root/results.json`` ({case: ["ok", notes] | ["error", message]})."""
    import socket

    import torch.distributed as dist

    from odc_pp.training.distributed import standalone_process_groups
    from odc_pp.megatron.dist_ckpt import save_megatron_checkpoint
    from odc_pp.megatron.model import ModelConfig, build_chunks
    from odc_pp.megatron.model_identity import megatron_args
    from odc_pp.training.arguments import parse_args
    from odc_pp.training.checkpoint.megatron_checkpoint import check_megatron_identity

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)
    groups = standalone_process_groups()
    base = dict(vocab_size=64, hidden_size=16, num_layers=2, num_attention_heads=4,
                max_sequence_length=16)
    for name, config, with_args in (("gpt", ModelConfig(**base), True),
                                    ("bare", ModelConfig(**base), False),
                                    ("tied", ModelConfig(**base, tie_embeddings=True), True)):
        (chunk,) = build_chunks(config, pp_rank=0, pp_size=1, process_groups=groups)
        save_megatron_checkpoint(chunk, os.path.join(root, name), 3, process_groups=groups,
                                 args=megatron_args(config) if with_args else None)
    from odc_pp.megatron.dist_ckpt import odc_state_from_megatron, read_megatron_tensors
    from odc_pp.training.model_setup import model_config

    results = {}
    for case, (saved, extra) in CASES.items():
        load = os.path.join(root, saved)
        args = parse_args(SIZE + extra + ["--mock-data", "--load", load])
        config = model_config(args.model, vocab_size=64, device="cpu", num_stages=1)
        chunks = build_chunks(config, pp_rank=0, pp_size=1, process_groups=groups)
        directory = os.path.join(load, "iter_0000003")
        weights, _ = odc_state_from_megatron(read_megatron_tensors(directory), num_layers=2)
        try:
            notes = check_megatron_identity(argparse.Namespace(chunks=chunks), args,
                                            directory, set(weights))
            results[case] = ["ok", notes]
        except ValueError as exc:
            results[case] = ["error", str(exc)]
    results.update(_hf_loads(root, groups))
    with open(os.path.join(root, "results.json"), "w") as handle:
        json.dump(results, handle)
    dist.destroy_process_group()


def _hf_loads(root: str, groups) -> dict:
    """A tiny Llama with and without ``attention_bias`` (q/k/v *and* o_proj biases; the
    model takes only the qkv bias) loaded through load_hf_weights."""
    import transformers

    from odc_pp.megatron.hf import load_hf_weights, model_config_from_hf
    from odc_pp.megatron.hf_config import read_hf_config
    from odc_pp.megatron.model import build_chunks

    results = {}
    for case, bias in (("hf_llama", False), ("hf_llama_attention_bias", True)):
        directory = os.path.join(root, case)
        config = transformers.LlamaConfig(
            vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
            attention_bias=bias, tie_word_embeddings=False)
        transformers.AutoModelForCausalLM.from_config(config).save_pretrained(directory)
        model = model_config_from_hf(read_hf_config(directory))
        (chunk,) = build_chunks(model, pp_rank=0, pp_size=1, process_groups=groups)
        try:
            load_hf_weights([chunk], directory, model, tied_in_hf=False)
            results[case] = ["ok", []]
        except ValueError as exc:
            results[case] = ["error", str(exc)]
    return results


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    root = tmp_path_factory.mktemp("identity")
    done = subprocess.run([sys.executable, os.path.abspath(__file__), str(root)], cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1"),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return root, json.loads((root / "results.json").read_text())


def test_the_same_model_loads(checked):
    _, results = checked
    assert results["same"] == ["ok", []]
    assert results["same_bare"] == ["ok", []]
    assert results["same_tied"] == ["ok", []]


def test_a_head_count_that_keeps_every_shape_is_refused(checked):
    _, results = checked
    status, message = results["heads"]
    assert status == "error", message
    assert "num_attention_heads: saved 4 vs now 8 (--num-attention-heads)" in message
    assert "--finetune" in message  # the override is named


@pytest.mark.parametrize("case, flag, tensor", [
    ("no_bias", "--disable-bias-linear (checkpoint add_bias_linear=True, this run False)",
     "linear_fc1.bias"),
    ("rmsnorm", "--normalization (checkpoint normalization=LayerNorm, this run RMSNorm)",
     "input_layernorm.bias"),
    ("rope", "--position-embedding-type (checkpoint position_embedding_type="
             "learned_absolute, this run rope)", "model.embedding.position_embeddings.weight"),
])
def test_checkpoint_tensors_the_model_lacks_name_the_flag(checked, case, flag, tensor):
    _, results = checked
    status, message = results[case]
    assert status == "error", message
    assert "checkpoint tensors this model lacks" in message and tensor in message, message
    assert f"{flag} differs" in message, message


def test_without_recorded_args_the_tensors_still_name_the_flag(checked):
    """megatron-core alone writes no args: the unused tensors name the flag; a head count
    that keeps every shape cannot be seen there (Megatron-LM's args record it)."""
    _, results = checked
    status, message = results["rope_bare"]
    assert status == "error" and "--position-embedding-type differs" in message, message
    assert results["heads_bare"] == ["ok", []]


def test_a_tied_checkpoint_into_an_untied_model_is_named(checked):
    _, results = checked
    status, message = results["tied_into_untied"]
    assert status == "error", message
    assert "untie_embeddings_and_output_weights: saved False vs now True" in message
    assert "model.output_layer.weight" in message


def test_an_untied_checkpoint_into_the_default_tied_model_is_named(checked):
    _, results = checked
    status, message = results["untied_into_tied"]
    assert status == "error", message
    assert "untie_embeddings_and_output_weights: saved True vs now False" in message
    assert "model.output_layer.weight" in message and \
        "--untie-embeddings-and-output-weights" in message


def test_finetune_loads_deliberately_and_says_what_it_drops(checked):
    _, results = checked
    status, notes = results["no_bias_finetune"]
    assert status == "ok", notes
    text = "\n".join(notes)
    assert "add_bias_linear: saved True vs now False (--disable-bias-linear)" in text
    assert "checkpoint tensors this model lacks (dropped)" in text and "bias" in text
    status, notes = results["tied_finetune"]
    assert status == "ok" and any("(model.output_layer.weight)" in n and "a copy of the "
                                  "checkpoint's tied embedding" in n for n in notes), notes


def test_hf_tensors_the_model_does_not_use_name_the_flag(checked):
    """A Llama with attention_bias has an o_proj bias the model has no place for: it was
    dropped silently."""
    _, results = checked
    assert results["hf_llama"] == ["ok", []]
    status, message = results["hf_llama_attention_bias"]
    assert status == "error", message
    assert "model.layers.0.self_attn.o_proj.bias" in message, message
    assert "--disable-bias-linear differs" in message, message


def test_common_pt_args_are_read_without_running_code(tmp_path):
    from odc_pp.megatron.model_identity import read_megatron_args

    marker = tmp_path / "ran"

    class Hostile:
        def __reduce__(self):
            return (exec, (f"open({str(marker)!r}, 'w').close()",))

    args = argparse.Namespace(num_layers=2, num_attention_heads=4, hidden_size=16,
                              attention_backend=Hostile(), params_dtype=torch.bfloat16)
    torch.save({"args": args, "iteration": 3}, tmp_path / "common.pt",
               pickle_module=pickle)
    read = read_megatron_args(str(tmp_path))
    assert not marker.exists()
    assert read["num_layers"] == 2 and read["params_dtype"] == torch.bfloat16
    assert type(read["attention_backend"]).__name__ == "exec"  # an inert placeholder


def test_our_checkpoints_compare_the_same_identity():
    from odc_pp.training.checkpoint.resume import model_differences

    saved = {"num_layers": 4, "hidden_size": 32, "num_attention_heads": 4,
             "ffn_hidden_size": 128, "max_position_embeddings": 48, "vocab_size": 48}
    assert model_differences(saved, dict(saved, tie_embeddings=False)) == []
    assert model_differences(dict(saved, tie_embeddings=True), saved) == [
        "untie_embeddings_and_output_weights: saved False vs now True "
        "(--untie-embeddings-and-output-weights (--untie-embeddings))"]
    rope = dict(saved, position_embedding_type="rope")
    assert model_differences(rope, dict(rope, rotary_base=500000.0)) == [
        "rotary_base: saved 10000.0 vs now 500000.0 (--rotary-base)"]
    # positions beyond the table do not define a rope model
    assert model_differences(rope, dict(rope, max_position_embeddings=96)) == []


def _pretrain(tmp_path, flags):
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, os.path.join(ROOT, "pretrain_gpt.py"), *SIZE,
                           "--mock-data", "--global-batch-size", "2", "--micro-batch-size",
                           "1", "--train-iters", "4", "--lr", "0", "--no-progress-bar",
                           *flags], capture_output=True, text=True, timeout=240, env=env,
                          cwd=str(tmp_path))


def test_pretrain_gpt_exits_2_on_another_head_count(checked, tmp_path):
    root, _ = checked
    run = _pretrain(tmp_path, UNTIED + ["--num-attention-heads", "8", "--load",
                                        str(root / "gpt")])
    assert run.returncode == 2, run.stderr[-3000:]
    assert "(--num-attention-heads)" in run.stderr, run.stderr[-3000:]


def test_pretrain_gpt_finetune_drops_the_biases_and_says_so(checked, tmp_path):
    root, _ = checked
    run = _pretrain(tmp_path, UNTIED + ["--disable-bias-linear", "--finetune", "--load",
                                        str(root / "gpt")])
    assert run.returncode == 0, run.stderr[-3000:]
    assert "note: --finetune: Megatron checkpoint" in run.stdout, run.stdout[-3000:]
    assert "(dropped)" in run.stdout


if __name__ == "__main__":
    _save_all(sys.argv[1])
