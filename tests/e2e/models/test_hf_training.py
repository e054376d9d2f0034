"""pretrain_gpt.py --hf-checkpoint: with --lr 0 the iteration-1 loss of pp=2 x dp=2 (and
of tp=2 + SP x pp=2) is transformers' token-weighted loss on the same samples; tools/export_hf.py writes back the
weights bit for bit (tied embeddings stay tied); with --load the checkpoint wins; a
contradicting flag exits 2 naming it."""

import json
import os
import random
import subprocess
import sys

import pytest
import torch

from tests.dist.models._tiny import make_hf_model
from odc_pp.testing.torchrun import ROOT, launch

pytest.importorskip("transformers")


def _write_pretokenized_data(path, count=40, seed=0):
    """Pre-tokenized samples (ids below the byte-level tokenizer's 256 bytes) whose first
    few predictions are masked out, as a prompt would be."""
    rng = random.Random(seed)
    with open(path, "w") as handle:
        for _ in range(count):
            ids = [rng.randrange(256) for _ in range(rng.randint(5, 40))]
            prompt = rng.randint(0, len(ids) - 2)
            mask = [0] * prompt + [1] * (len(ids) - 1 - prompt)
            handle.write(json.dumps({"input_ids": ids, "loss_mask": mask}) + "\n")


def _hf_loss_of_iteration(flags, hf_model, iteration: int = 1) -> float:
    """transformers' token-weighted loss over the samples of global batch ``iteration``."""
    from odc_pp.training.arguments import parse_args
    from odc_pp.training.data_plan import build_source

    args = parse_args(flags)
    source, _ = build_source(args)
    total = count = 0.0
    size = args.data.global_batch_size
    with torch.no_grad():
        for index in range((iteration - 1) * size, iteration * size):
            sample = source[index]
            ids = torch.from_numpy(sample.tokens)[None]
            logits = hf_model(ids).logits[0, :-1].double()
            losses = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none")
            weights = torch.from_numpy(sample.loss_mask).double()
            total += float((losses * weights).sum())
            count += float(weights.sum())
    return total / count


CASES = {
    # Llama 3 (untied, rope scaling, GQA) on pp=2 zbv x dp=2 odc
    "llama": ("llama", ["--pipeline-schedule", "zbv", "--dp-mode", "odc"]),
    # Qwen2 (qkv bias, tied embeddings: kept tied across the two stages) on 1f1b x
    # collective, recomputing RMSNorm/SwiGLU
    "qwen2": ("qwen2", ["--pipeline-schedule", "1f1b", "--dp-mode", "collective",
                        "--recompute-lgd"]),
    # tied Qwen2 on pp=4 (zb-h1): the first and the last stage on different ranks
    "qwen2_pp4": ("qwen2", ["--pipeline-schedule", "zb-h1", "--dp-mode", "odc",
                            "--pipeline-model-parallel-size", "4"]),
    # Llama 3 under tp=2 + SP x pp=2 zbv: qkv split per query group (GQA: one kv head per
    # rank), SwiGLU's gate/up per partition, vocab-parallel embedding and output layer
    "llama_tp2": ("llama", ["--pipeline-schedule", "zbv", "--dp-mode", "odc",
                            "--tensor-model-parallel-size", "2", "--sequence-parallel"]),
}


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(CASES))
def test_hf_in_loss_and_export_round_trip(kind, tmp_path):
    import transformers

    hf_dir = str(tmp_path / "hf")
    arch, case_flags = CASES[kind]
    hf_model = make_hf_model(arch, hf_dir, vocab_size=264, max_shard_size="40KB")
    data = str(tmp_path / "data.jsonl")
    _write_pretokenized_data(data)
    flags = ["--hf-checkpoint", hf_dir, "--seq-length", "48", "--data-path", data,
             "--tokenizer-type", "ByteLevelTokenizer",  # byte ids; the model dir has none
             "--global-batch-size", "8", "--micro-batch-size", "1",
             "--pipeline-model-parallel-size", "2", "--lr", "0", "--train-iters", "1",
             "--seed", "3", "--no-progress-bar", "--distributed-timeout-minutes", "1.5",
             *case_flags]
    save = str(tmp_path / "ckpt")
    run = launch(flags + ["--save", save], nproc=4, tmp_path=tmp_path, name=kind)
    assert run.returncode == 0, run.describe()
    (record,) = run.records()
    expected = _hf_loss_of_iteration(flags, hf_model)
    assert abs(record["loss"] - expected) <= 1e-5 * expected, (record["loss"], expected)

    out = str(tmp_path / "exported")
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHONWARNINGS="ignore")
    done = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "export_hf.py"),
                           "--load", save, "--output", out, "--max-shard-size", "30KB"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(os.path.join(out, "model.safetensors.index.json")) as handle:
        assert len(set(json.load(handle)["weight_map"].values())) > 1  # sharded
    original = json.loads((tmp_path / "hf" / "config.json").read_text())
    written = json.loads((tmp_path / "exported" / "config.json").read_text())
    assert written == original
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out)
    theirs, ours = hf_model.state_dict(), reloaded.state_dict()
    assert sorted(theirs) == sorted(ours)
    assert all(torch.equal(theirs[name], ours[name]) for name in theirs)

    if kind != "llama":
        return
    # with --load, the checkpoint wins over --hf-checkpoint (here another random model)
    other = str(tmp_path / "other")
    make_hf_model(arch, other, seed=1, vocab_size=264)
    resumed = [other if flag == hf_dir else flag for flag in flags]
    resumed[resumed.index("--train-iters") + 1] = "2"
    run = launch(resumed + ["--load", save], nproc=4, tmp_path=tmp_path, name="resumed")
    assert run.returncode == 0, run.describe()
    (record,) = run.records()
    assert record["iteration"] == 2
    expected = _hf_loss_of_iteration(flags, hf_model, iteration=2)
    assert abs(record["loss"] - expected) <= 1e-5 * expected, (record["loss"], expected)


def test_tied_model_stays_tied_on_two_stages_unless_untied(tmp_path):
    from odc_pp.training.arguments import parse_args
    from odc_pp.training.model_setup import model_config

    hf_dir = str(tmp_path / "hf")
    make_hf_model("qwen2", hf_dir)
    flags = ["--hf-checkpoint", hf_dir, "--mock-data", "--seq-length", "32"]
    vocab = parse_args(flags).model.vocab_size
    for stages in (1, 2):
        assert model_config(parse_args(flags).model, vocab_size=vocab, device="cpu",
                            num_stages=stages).tie_embeddings
    untied = model_config(parse_args(flags + ["--untie-embeddings"]).model, vocab_size=vocab,
                          device="cpu", num_stages=2)
    assert not untied.tie_embeddings


TIED_LAYOUTS = {
    "zbv": ["--pipeline-schedule", "zbv"],
    "1f1b": ["--pipeline-schedule", "1f1b"],
    # two one-rank "hosts": the tie group is built per host
    "1f1b-hierarchical": ["--pipeline-schedule", "1f1b", "--dp-mode", "hierarchical",
                          "--dp-ranks-per-host", "1"],
}


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.parametrize("layout", sorted(TIED_LAYOUTS))
def test_tied_embeddings_across_stages_train_as_one_weight(layout, tmp_path):
    """Tied Qwen2 on pp=2 x dp=2: iteration 1 is transformers' loss; 5 AdamW steps with
    clipping give the losses of the pp=1 run (one shared weight), the checkpoint's two
    copies are bitwise equal and the export is tied."""
    import transformers

    hf_dir = str(tmp_path / "hf")
    hf_model = make_hf_model("qwen2", hf_dir, vocab_size=264)
    data = str(tmp_path / "data.jsonl")
    _write_pretokenized_data(data)
    flags = ["--hf-checkpoint", hf_dir, "--seq-length", "48", "--data-path", data,
             "--tokenizer-type", "ByteLevelTokenizer",  # byte ids; the model dir has none
             "--global-batch-size", "8", "--micro-batch-size", "1", "--lr", "1e-2",
             "--clip-grad", "0.5", "--train-iters", "5", "--seed", "3", "--no-progress-bar",
             "--distributed-timeout-minutes", "1.5"]
    save = str(tmp_path / "ckpt")
    run = launch(flags + ["--pipeline-model-parallel-size", "2", *TIED_LAYOUTS[layout],
                          "--save", save],
                 nproc=4, tmp_path=tmp_path, name="pp2")
    assert run.returncode == 0, run.describe()
    reference = launch(flags, nproc=1, tmp_path=tmp_path, name="pp1")
    assert reference.returncode == 0, reference.describe()
    losses, expected = run.losses(), reference.losses()
    hf_loss = _hf_loss_of_iteration(flags, hf_model)
    assert abs(losses[0] - hf_loss) <= 1e-5 * hf_loss, (losses[0], hf_loss)
    assert len(losses) == 5, losses
    for ours, theirs in zip(losses, expected):
        assert abs(ours - theirs) <= 1e-5 * theirs, (losses, expected)

    sys.path.insert(0, os.path.join(ROOT, "tools"))
    from export_checkpoint import export

    _, state = export(save)
    (embedding,) = [t for n, t in state.items() if n.endswith("word_embeddings.weight")]
    (output,) = [t for n, t in state.items() if n.endswith("output_layer.weight")]
    assert torch.equal(embedding, output)
    assert not torch.equal(embedding, hf_model.model.embed_tokens.weight)  # it moved

    out = str(tmp_path / "exported")
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHONWARNINGS="ignore")
    done = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "export_hf.py"),
                           "--load", save, "--output", out], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp_path / "exported" / "config.json").read_text())[
        "tie_word_embeddings"] is True
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert "lm_head.weight" not in {n for n, _ in reloaded.named_parameters()} or \
        reloaded.lm_head.weight is reloaded.model.embed_tokens.weight
    assert torch.equal(reloaded.model.embed_tokens.weight, embedding.to(
        reloaded.model.embed_tokens.weight.dtype))


def test_contradicting_flag_exits_2_naming_it(tmp_path, capsys):
    """The script exits 2 (one subprocess); the other flags through the same entry point
    in this process (a subprocess each cost 5 s of imports)."""
    import odc_pp.train

    hf_dir = str(tmp_path / "hf")
    make_hf_model("mistral", hf_dir)
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHONWARNINGS="ignore")
    done = subprocess.run([sys.executable, os.path.join(ROOT, "pretrain_gpt.py"),
                           "--hf-checkpoint", hf_dir, "--mock-data", "--num-layers", "3"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "--num-layers 3 contradicts" in done.stderr, done.stderr[-2000:]
    for flag, value in (("--num-query-groups", "4"), ("--norm-epsilon", "1e-5")):
        extra = ["--group-query-attention"] if flag == "--num-query-groups" else []
        code = odc_pp.train.main(["--hf-checkpoint", hf_dir, "--mock-data", flag, value,
                                  *extra])
        err = capsys.readouterr().err
        assert code == 2, err[-2000:]
        assert f"{flag} {value if flag != '--norm-epsilon' else '1e-05'} contradicts" \
            in err, err[-2000:]
    # omitted shape flags come from the config; a flag that agrees is fine
    from odc_pp.training.arguments import parse_args

    args = parse_args(["--hf-checkpoint", hf_dir, "--mock-data", "--num-layers", "4"])
    assert (args.model.num_layers, args.model.hidden_size, args.model.num_query_groups,
            args.model.ffn_hidden_size, args.model.vocab_size, args.model.swiglu,
            args.model.normalization) == (4, 32, 2, 48, 96, True, "RMSNorm")
