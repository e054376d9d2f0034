import io
import json
import math
import os
import subprocess
import sys

import pytest

from odc_pp.training.arguments import build_parser, parse_args
from odc_pp.training.logging_utils import TrainingLogger
from odc_pp.training.lr_schedule import LRSchedule

BASE = ["--mock-data", "--vocab-size", "64"]


def test_every_megatron_flag_parses():
    args = parse_args(BASE + [
        "--num-layers", "8", "--hidden-size", "32", "--num-attention-heads", "4",
        "--ffn-hidden-size", "64", "--seq-length", "64", "--max-position-embeddings", "128",
        "--micro-batch-size", "2", "--global-batch-size", "16",
        "--pipeline-model-parallel-size", "2", "--tensor-model-parallel-size", "1",
        "--lr", "3e-4", "--min-lr", "3e-5", "--lr-decay-style", "linear",
        "--lr-warmup-iters", "2", "--weight-decay", "0.1", "--clip-grad", "0.5", "--bf16",
        "--train-iters", "20", "--save", "/tmp/x", "--load", "/tmp/x", "--save-interval", "5",
        "--log-interval", "2", "--tokenizer-type", "ByteLevelTokenizer", "--seed", "9",
        "--pipeline-schedule", "zbv", "--num-model-chunks", "2", "--memory-limit", "4",
        "--dp-mode", "odc",
        "--load-balance", "lb-mini", "--log-json", "/tmp/x.jsonl",
        "--max-tokens-per-microbatch", "128"])
    assert args.model.num_layers == 8 and args.model.ffn_hidden_size == 64 and args.model.bf16
    assert args.schedule.pipeline_schedule == "zbv" and args.schedule.num_model_chunks == 2
    assert args.optimizer.lr_decay_iters == 20 and args.data.load_balance == "lb-mini"
    assert args.resolve(4).layout.dp == 2


def test_defaults_fill_in():
    args = parse_args(BASE + ["--hidden-size", "32", "--pipeline-schedule", "zbv",
                              "--pipeline-model-parallel-size", "2"])
    assert args.model.ffn_hidden_size == 128 and args.model.max_position_embeddings == args.model.seq_length
    assert args.schedule.num_model_chunks == 2
    assert parse_args(BASE).schedule.num_model_chunks == 1


@pytest.mark.parametrize("extra, flags", [
    (["--tensor-model-parallel-size", "3"], ["--tensor-model-parallel-size", "--num-attention-heads"]),
    (["--keep-sp-input-for-w"], ["--keep-sp-input-for-w", "--sequence-parallel"]),
    (["--pipeline-schedule", "zbv", "--num-model-chunks", "3"], ["--num-model-chunks"]),
    (["--pipeline-schedule", "zbv", "--pipeline-model-parallel-size", "2", "--num-layers", "6"],
     ["--num-layers", "--pipeline-model-parallel-size"]),
    (["--hidden-size", "30"], ["--hidden-size", "--num-attention-heads"]),
    (["--cpu-offload"], ["--cpu-offload", "--pipeline-schedule"]),
    (["--min-lr", "1"], ["--min-lr"]),
    (["--profile-iters", "-1"], ["--profile-iters"]),
    (["--pipeline-schedule", "offload", "--cpu-offload", "--fill-pipeline-gaps"],
     ["--fill-pipeline-gaps", "--pipeline-schedule offload"]),
    (["--save-interval", "3"], ["--save-interval", "--save"]),
    (["--pipeline-schedule", "1f1b", "--num-model-chunks", "2"], ["--num-model-chunks"]),
])
def test_bad_combinations_name_the_flags(extra, flags):
    with pytest.raises(ValueError) as info:
        parse_args(BASE + extra)
    for flag in flags:
        assert flag in str(info.value)


def test_data_source_and_world_size_checks():
    with pytest.raises(ValueError, match="--mock-data"):
        parse_args([])
    with pytest.raises(ValueError, match="--vocab-size"):
        parse_args(["--mock-data"])
    args = parse_args(BASE + ["--global-batch-size", "6", "--micro-batch-size", "2",
                              "--pipeline-model-parallel-size", "2", "--num-layers", "4"])
    with pytest.raises(ValueError, match="--pipeline-model-parallel-size 2"):
        args.resolve(3).layout.dp
    with pytest.raises(ValueError, match="--global-batch-size 6 must be a multiple"):
        args.resolve(4).layout.dp


def test_unknown_flag_is_one_line_naming_it(capsys):
    with pytest.raises(ValueError, match="--num-layerz: unknown flag") as info:
        parse_args(BASE + ["--num-layerz", "3"])
    assert "usage" not in str(info.value) and capsys.readouterr().err == ""


def test_help_comes_from_field_docstrings():
    text = build_parser().format_help()
    assert "Samples per iteration, over all data-parallel ranks" in text


def test_lr_schedule_closed_form():
    sched = LRSchedule(lr=1.0, min_lr=0.1, warmup_iters=2, decay_iters=12, style="cosine")
    assert sched.lr_at(0) == pytest.approx(0.5) and sched.lr_at(1) == pytest.approx(1.0)
    assert sched.lr_at(2) == pytest.approx(1.0)
    assert sched.lr_at(7) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert sched.lr_at(12) == pytest.approx(0.1) and sched.lr_at(50) == pytest.approx(0.1)
    linear = LRSchedule(lr=1.0, min_lr=0.0, decay_iters=10, style="linear")
    assert linear.lr_at(5) == pytest.approx(0.5)
    assert LRSchedule(lr=0.3, style="constant", decay_iters=3).lr_at(100) == 0.3
    with pytest.raises(ValueError, match="min-lr"):
        LRSchedule(lr=0.1, min_lr=0.2)


def test_logger_writes_json_lines(tmp_path):
    stream = io.StringIO()
    path = tmp_path / "log" / "train.jsonl"
    logger = TrainingLogger(train_iters=3, log_json=str(path), tensorboard_dir=None,
                            stream=stream)
    for i in (1, 2):
        logger.progress(i)
        logger.log({"iteration": i, "loss": 2.0 / i, "lr": 1e-3, "grad_norm": 0.5,
                    "tokens_per_s": 100.0, "step_s": 0.1, "idle_s": [0.01, 0.02]})
    logger.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["iteration"] for line in lines] == [1, 2] and lines[1]["loss"] == 1.0
    assert "loss 2.0000" in stream.getvalue() and "idle/rank 10 20 ms" in stream.getvalue()


def test_export_tool_fails_clearly_without_a_checkpoint(tmp_path):
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))), "tools", "export_checkpoint.py")
    result = subprocess.run([sys.executable, script, "--load", str(tmp_path / "none"),
                             "--output", str(tmp_path / "out.pt")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "no checkpoint under" in result.stderr and not (tmp_path / "out.pt").exists()


def test_fault_flags_belong_to_the_testing_entry_only():
    """--inject-* are not product flags; odc_pp.testing.faults parses and checks them and
    passes the rest on."""
    from odc_pp.testing.faults import parse_fault_flags

    faults, rest = parse_fault_flags(["--inject-nonfinite-grad-iter", "3", "--lr", "1e-3"])
    assert faults.nonfinite_iter == 3 and rest == ["--lr", "1e-3"]
    with pytest.raises(ValueError, match="--inject-nonfinite-grad-iter must be >= 1"):
        parse_fault_flags(["--inject-nonfinite-grad-iter", "0"])
    with pytest.raises(ValueError, match="--inject-nonfinite-grad-iter"):
        parse_args(["--num-layers", "2", "--hidden-size", "8", "--num-attention-heads", "2",
                    "--seq-length", "8", "--mock-data", "--vocab-size", "16",
                    "--inject-nonfinite-grad-iter", "3"])
