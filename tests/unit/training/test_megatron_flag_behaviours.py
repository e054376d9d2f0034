"""Megatron's semantics for flags with a direct equivalent (samples, warmup fraction,
padded vocabulary, the default global batch, profiling), tolerated no-op combinations, and
parse errors as one line per flag, printed once per job."""

import pytest

from odc_pp.training.arguments import parse_args, parse_args_with_notes

BASE = ["--mock-data", "--vocab-size", "64"]


def test_missing_global_batch_size_is_micro_batch_times_dp_as_megatron():
    args = parse_args(BASE + ["--micro-batch-size", "2"])
    job = args.resolve(4)
    assert job.layout.dp == 4
    assert job.args.data.global_batch_size == 8
    assert args.data.global_batch_size is None  # the parsed flags are not rewritten
    assert list(job.notes) == ["note: no --global-batch-size: --micro-batch-size 2 x "
                               "data-parallel size 4 = 8, as Megatron"]
    given = parse_args(BASE + ["--global-batch-size", "16"]).resolve(4)
    assert given.args.data.global_batch_size == 16 and given.notes == ()


def test_samples_become_iterations_of_the_global_batch():
    args = parse_args(BASE + ["--global-batch-size", "8", "--train-samples", "100",
                              "--lr-decay-samples", "50", "--lr-warmup-samples", "10"])
    assert (args.run.train_iters, args.optimizer.lr_decay_iters,
            args.optimizer.lr_warmup_iters) == (12, 7, 2)  # 100 // 8, ceil(50/8), ceil(10/8)
    assert "--train-samples 100 -> --train-iters 12" in args.resolution_notes[0]
    late = parse_args(BASE + ["--train-samples", "16"])  # the global batch known at dp
    assert late.run.train_iters is None
    late = late.resolve(4).args
    assert (late.data.global_batch_size, late.run.train_iters,
            late.optimizer.lr_decay_iters) == (4, 4, 4)


def test_warmup_fraction_of_the_decay_length():
    args = parse_args(BASE + ["--train-iters", "10", "--lr-warmup-fraction", "0.25"])
    assert args.optimizer.lr_warmup_iters == 3  # ceil(2.5)
    args = parse_args(BASE + ["--train-iters", "500", "--lr-decay-iters", "430",
                              "--lr-warmup-fraction", ".001"])
    assert args.optimizer.lr_warmup_iters == 1


@pytest.mark.parametrize("flags,named", [
    (["--train-iters", "5", "--train-samples", "10"], "--train-iters and --train-samples"),
    (["--lr-warmup-iters", "2", "--lr-warmup-fraction", "0.1"], "--lr-warmup-fraction"),
    (["--lr-decay-iters", "2", "--lr-decay-samples", "10"], "--lr-decay-samples"),
    (["--lr-warmup-fraction", "2"], "--lr-warmup-fraction must be in"),
    (["--global-batch-size", "8", "--train-samples", "4"], "less than one global batch"),
])
def test_length_conflicts_name_the_flags(flags, named):
    with pytest.raises(ValueError, match=named):
        parse_args(BASE + flags)


def test_padded_vocab_size_is_the_vocabulary():
    args, notes = parse_args_with_notes(["--mock-data", "--padded-vocab-size", "96"])
    assert args.model.vocab_size == 96
    assert any(note.startswith("note: --padded-vocab-size 96: mapped") for note in notes)
    with pytest.raises(ValueError, match="--padded-vocab-size 96 and --vocab-size 64 disagree"):
        parse_args_with_notes(BASE + ["--padded-vocab-size", "96"])


def test_init_method_std_reaches_the_model():
    from odc_pp.training.model_setup import model_config

    args = parse_args(BASE + ["--init-method-std", "0.006"])
    config = model_config(args.model, vocab_size=64, device="cpu", num_stages=1)
    assert config.init_method_std == 0.006
    with pytest.raises(ValueError, match="--init-method-std must be finite and > 0"):
        parse_args(BASE + ["--init-method-std", "0"])


def test_profile_maps_to_the_trace_unless_given():
    args, notes = parse_args_with_notes(BASE + ["--profile", "--profile-step-start", "4"])
    assert args.logging.trace == "profile_trace.json"
    args, _ = parse_args_with_notes(BASE + ["--profile", "--trace", "mine.json"])
    assert args.logging.trace == "mine.json"


def test_split_with_mock_data_is_ignored_with_a_note():
    args, notes = parse_args_with_notes(BASE + ["--split", "99,1,0"])
    assert args.data.split is None
    assert any(note.startswith("note: --split 99,1,0 with --mock-data: ignored")
               for note in notes)


def test_no_op_at_value_and_refused_otherwise():
    _, notes = parse_args_with_notes(BASE + ["--softmax-type", "vanilla",
                                             "--rotary-percent", "1", "--expert-model-"
                                             "parallel-size", "1"])
    assert sum(note.startswith("note: --") and "no-op" in note for note in notes) == 3
    with pytest.raises(ValueError) as error:
        parse_args_with_notes(BASE + ["--expert-model-parallel-size", "2", "--rotary-percent",
                                      "0.5", "--moe-router-topk", "2"])
    lines = str(error.value).splitlines()
    assert lines[0] == "3 flags not taken:"
    assert [line.split(":")[0].strip() for line in lines[1:]] == [
        "--expert-model-parallel-size 2", "--rotary-percent 0.5", "--moe-router-topk 2"]


def test_unknown_flags_one_line_each_no_usage_block():
    with pytest.raises(ValueError) as error:
        parse_args_with_notes(BASE + ["--frobnicate", "3", "--num-layer", "4", "--bf16"])
    lines = str(error.value).splitlines()
    assert lines[0] == "2 flags not taken:" and len(lines) == 3
    assert lines[1].strip().startswith("--frobnicate: unknown flag")
    assert "did you mean --num-layers?" in lines[2]
    with pytest.raises(ValueError, match="--num-layers 'four': invalid int value"):
        parse_args_with_notes(BASE + ["--num-layers", "four"])


def test_main_prints_the_flag_lines_once_on_rank_zero_and_exits_2(capsys, monkeypatch):
    from odc_pp.training import training

    monkeypatch.setattr(training.time, "sleep", lambda seconds: None)
    argv = BASE + ["--fp8-format", "hybrid", "--frobnicate"]
    monkeypatch.setenv("RANK", "0")
    assert training.main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "pretrain_gpt.py: error: 2 flags not taken:" and len(err) == 3
    assert "bf16 only; Transformer Engine FP8 is not supported" in err[1]
    monkeypatch.setenv("RANK", "1")
    assert training.main(argv) == 2
    assert capsys.readouterr().err == ""
