"""Issue 51: examples/llama/train_llama3_8b_h200_bf16.sh (mock-data branch) and a
Megatron-style Llama-2 SFT launch (tests/data/megatron_scripts, shrunk in size only) train
on the first launch with torchrun on 2 ranks; the parameter norm and the zero-gradient
count are the same on every layout (each element once), and TensorBoard's reader reads
the events."""

import json

import pytest

from odc_pp.testing.torchrun import launch
from tests.unit.data.tiny_hf import CHATML_PLAIN, word_level_tokenizer
from tests.unit.training.test_megatron_scripts import argv_of, read_flags, shrunk
from tests.unit.training.test_megatron_sft_flags import _scalars

EXTRA = ["--no-progress-bar"]


def test_llama3_h200_bf16_script_trains_on_the_first_launch(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    argv = argv_of(shrunk(read_flags("train_llama3_8b_h200_bf16"), tmp_path))
    run = launch(argv + EXTRA + ["--trace", str(tmp_path / "t.json")], nproc=2,
                 tmp_path=tmp_path, name="h200", timeout=300)
    assert run.returncode == 0, run.describe()
    records = run.records()
    assert len(records) == 4 and all(r["params_norm"] > 0 and r["num_zeros_in_grad"] >= 0
                                     for r in records), run.describe()
    scalars = _scalars(tmp_path / "tensorboard_logs_path")
    assert [s for s, _ in scalars["params-norm"]] == [1, 2, 3, 4]
    assert {"num-zeros", "iteration-time", "throughput", "lm loss"} <= set(scalars)
    for note in ("note: --log-params-norm", "note: --log-timers-to-tensorboard"):
        assert note not in run.stdout  # odc-pp's own flags now, no translation note
    assert run.stdout.count("note: --use-mcore-models:") == 1, run.describe()


def _sft_inputs(tmp_path) -> None:
    """A ChatML tokenizer at --tokenizer-model and 'messages' conversations at --data-path."""
    word_level_tokenizer(tmp_path / "tokenizer_model", CHATML_PLAIN)
    turns = [{"role": "user", "content": "hello there how are you"},
             {"role": "assistant", "content": "fine thanks here is the answer"}]
    (tmp_path / "dataset.jsonl").write_text(
        "\n".join(json.dumps({"messages": turns}) for _ in range(60)) + "\n")


def test_llama2_sft_script_trains_on_the_first_launch(tmp_path):
    _sft_inputs(tmp_path)
    flags = shrunk(read_flags("sft_llama2_7b"), tmp_path)
    pretrained = str(tmp_path / "pretrained_checkpoint")
    skip = ("--load", "--finetune", "--use-checkpoint-args", "--exit-on-missing-checkpoint",
            "--no-load-optim", "--no-load-rng", "--save", "--tensorboard-dir")
    base = [t for t in flags if t[0] not in skip]
    # --timing-log-level maps to --trace timers_trace.json, relative to the launch's
    # directory (the repository here): the test's own --trace keeps the checkout clean
    trace = ["--trace", str(tmp_path / "timers_trace.json")]
    made = launch(argv_of(base) + EXTRA + trace + ["--save", pretrained], nproc=2,
                  tmp_path=tmp_path, name="pretrained", timeout=300)
    assert made.returncode == 0, made.describe()
    run = launch(argv_of(flags) + EXTRA + trace, nproc=2, tmp_path=tmp_path, name="sft",
                 timeout=300)
    assert run.returncode == 0, run.describe()
    last = run.records()[-1]  # --log-interval 10: the last iteration is logged
    assert last["iteration"] == 4, run.describe()
    assert "note: samples: one document per sample" in run.stdout
    for note in ("note: --sft:", "note: --tokenizer-type Llama2Tokenizer:",
                 "note: --num-layers-per-virtual-pipeline-stage 1: mapped: --num-model-chunks 2",
                 "note: --use-checkpoint-args:", "note: --exit-on-missing-checkpoint:"):
        assert run.stdout.count(note) == 1, (note, run.describe())
    lines = run.stdout.splitlines()
    notes = [line for line in lines if line.startswith("note:")]
    assert len(notes) == len(set(notes)), run.describe()  # no note printed twice
    # its --hidden-dropout 0.0 and --attention-dropout 0.0 notes say it: not again
    assert "note: dropout 0.0 (hidden and attention)" not in run.stdout
    scalars = _scalars(tmp_path / "tensorboard_logs_path")
    assert [s for s, _ in scalars["iteration-time"]] == [1, 2, 3, 4]


@pytest.mark.parametrize("layout", [["--pipeline-model-parallel-size", "2"],
                                    ["--pipeline-model-parallel-size", "1"]],
                         ids=["pp2", "dp2"])
def test_params_norm_and_zero_count_do_not_depend_on_the_layout(tmp_path, layout):
    flags = ["--mock-data", "--vocab-size", "100", "--num-layers", "4", "--hidden-size", "32",
             "--num-attention-heads", "4", "--seq-length", "32", "--global-batch-size", "4",
             "--train-iters", "2", "--untie-embeddings", "--log-params-norm",
             "--log-num-zeros-in-grad"] + EXTRA
    one = launch(flags, nproc=1, tmp_path=tmp_path, name="one", timeout=300)
    two = launch(flags + layout, nproc=2, tmp_path=tmp_path, name="two", timeout=300)
    assert one.returncode == 0 and two.returncode == 0, (one.describe(), two.describe())
    for a, b in zip(one.records(), two.records()):
        assert b["params_norm"] == pytest.approx(a["params_norm"], rel=1e-5)
        # > 0: the embedding rows of the tokens the batch does not hold
        assert b["num_zeros_in_grad"] == a["num_zeros_in_grad"] > 0
