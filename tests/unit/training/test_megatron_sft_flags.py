"""Issue 51, item 4: the SFT, checkpoint-argument, timing and TensorBoard flags of a
Megatron-style Llama-2 SFT script and of examples/llama/train_llama3_8b_h200_bf16.sh are
answered (honoured, mapped or refused with a reason), the virtual pipeline size maps to
--num-model-chunks, Megatron's tokenizer names map to ours, "did you mean" looks at
Megatron's names before spelling, and a bad value is reported with the launch's other
problems. TensorBoard's own event reader reads what the logger writes."""

import io

import pytest

from odc_pp.training.arguments import build_parser, parse_args_with_notes
from odc_pp.training.logging_utils import TrainingLogger
from odc_pp.training.megatron_flags import outcome

BASE = ["--mock-data", "--vocab-size", "64"]
NATIVE = frozenset(o for action in build_parser()._actions for o in action.option_strings)
ISSUE_FLAGS = [["--sft"], ["--dataloader-type", "cyclic"], ["--use-checkpoint-args"],
               ["--exit-on-missing-checkpoint"], ["--log-timers-to-tensorboard"],
               ["--log-validation-ppl-to-tensorboard"], ["--timing-log-level", "2"],
               ["--log-params-norm"], ["--log-num-zeros-in-grad"],
               ["--num-layers-per-virtual-pipeline-stage", "1"],
               ["--tokenizer-type", "Llama2Tokenizer"], ["--tensorboard-log-interval", "5"]]


@pytest.mark.parametrize("tokens", ISSUE_FLAGS, ids=lambda t: t[0])
def test_each_flag_of_the_issue_is_answered(tokens):
    action, note = outcome(tokens, NATIVE, ["--tokenizer-model", "x"])
    assert action in ("native", "honoured", "mapped", "no-op"), (tokens, action)
    assert action == "native" or note


def test_the_sft_script_flags_parse_in_one_launch(tmp_path):
    argv = BASE + ["--num-layers", "8", "--pipeline-model-parallel-size", "2",
                   "--num-layers-per-virtual-pipeline-stage", "2", "--sft",
                   "--dataloader-type", "single", "--use-checkpoint-args",
                   "--exit-on-missing-checkpoint", "--timing-log-level", "2",
                   "--tensorboard-dir", str(tmp_path), "--log-timers-to-tensorboard",
                   "--log-validation-ppl-to-tensorboard", "--log-params-norm",
                   "--log-num-zeros-in-grad"]
    args, notes = parse_args_with_notes(argv)
    assert args.schedule.num_model_chunks == 2  # 8 layers / pp 2 / 2, as Megatron
    assert args.schedule.pipeline_schedule == "interleaved"
    assert args.data.sample_construction == "document"
    assert args.logging.trace == "timers_trace.json"
    assert args.logging.log_params_norm and args.logging.log_num_zeros_in_grad
    assert args.logging.log_timers_to_tensorboard
    for flag in ("--sft", "--dataloader-type", "--use-checkpoint-args",
                 "--exit-on-missing-checkpoint", "--timing-log-level",
                 "--num-layers-per-virtual-pipeline-stage"):
        assert sum(note.startswith(f"note: {flag}") for note in notes) == 1, (flag, notes)


def test_virtual_pipeline_size_one_and_bad_sizes():
    args, notes = parse_args_with_notes(BASE + ["--num-layers", "8",
                                                "--pipeline-model-parallel-size", "2",
                                                "--num-layers-per-virtual-pipeline-stage", "4"])
    assert args.schedule.num_model_chunks == 1 and args.schedule.pipeline_schedule == "1f1b"
    assert any("no virtual pipeline" in note for note in notes)
    args, _ = parse_args_with_notes(BASE + ["--num-layers", "8", "--pipeline-model-parallel-size",
                                            "2", "--num-virtual-stages-per-pipeline-rank", "2",
                                            "--pipeline-schedule", "zbv"])
    assert (args.schedule.num_model_chunks, args.schedule.pipeline_schedule) == (2, "zbv")
    with pytest.raises(ValueError) as error:
        parse_args_with_notes(BASE + ["--num-layers", "8", "--pipeline-model-parallel-size", "2",
                                      "--num-layers-per-virtual-pipeline-stage", "3"])
    assert "--num-layers 8 / --pipeline-model-parallel-size 2 must be a multiple" in \
        str(error.value)


def test_layers_per_virtual_stage_count_the_accounted_embedding_and_loss():
    """Megatron's --num-layers-per-virtual-pipeline-stage divides --num-layers plus the
    embedding and loss accounted in the split: PipeOffload's 38 layers at pp 8 with one
    layer a virtual stage are 5 chunks a rank."""
    accounted = ["--account-for-embedding-in-pipeline-split",
                 "--account-for-loss-in-pipeline-split"]
    args, _ = parse_args_with_notes(BASE + ["--num-layers", "38",
                                            "--pipeline-model-parallel-size", "8",
                                            "--num-layers-per-virtual-pipeline-stage", "1",
                                            *accounted])
    assert args.schedule.num_model_chunks == 5
    assert args.parallel.account_for_embedding_in_pipeline_split
    assert args.parallel.account_for_loss_in_pipeline_split
    with pytest.raises(ValueError) as error:
        parse_args_with_notes(BASE + ["--num-layers", "38", "--pipeline-model-parallel-size",
                                      "8", "--num-layers-per-virtual-pipeline-stage", "2",
                                      *accounted])
    assert ("--num-layers 38 + 1 (--account-for-embedding-in-pipeline-split) + 1 "
            "(--account-for-loss-in-pipeline-split) / --pipeline-model-parallel-size 8 "
            "must be a multiple") in str(error.value)


@pytest.mark.parametrize("name", ["Llama2Tokenizer", "Llama3Tokenizer", "SentencePieceTokenizer",
                                  "TikTokenizer", "GPTSentencePieceTokenizer"])
def test_megatron_tokenizer_names_map_to_hugging_face_with_a_note(name, tmp_path):
    argv = ["--data-path", str(tmp_path / "d.jsonl"), "--tokenizer-type", name,
            "--tokenizer-model", str(tmp_path)]
    args, notes = parse_args_with_notes(argv)
    assert args.data.tokenizer_type == "HuggingFaceTokenizer"
    assert any(note.startswith(f"note: --tokenizer-type {name}: Megatron's {name}")
               for note in notes)


def test_did_you_mean_comes_from_megatron_names_before_spelling():
    with pytest.raises(ValueError) as error:
        parse_args_with_notes(BASE + ["--use-checkpoint-arg", "--timing-log-levels", "1",
                                      "--ckpt-step", "3", "--hiden-size", "8", "--sftt"])
    lines = {line.split()[0].rstrip(":"): line for line in str(error.value).splitlines()[1:]}
    assert "did you mean --use-checkpoint-args? Megatron-LM's flag" in \
        lines["--use-checkpoint-arg"]
    assert "--keep-checkpoints" not in lines["--use-checkpoint-arg"]
    assert "did you mean --timing-log-level?" in lines["--timing-log-levels"]
    assert "--min-loss-scale" not in lines["--timing-log-levels"]
    assert "did you mean --sft?" in lines["--sftt"] and "--split" not in lines["--sftt"]
    assert "Megatron-LM's flag, not taken: --load takes the newest checkpoint" in \
        lines["--ckpt-step"]
    assert "did you mean --hidden-size?" in lines["--hiden-size"]


def test_invalid_choice_is_reported_with_the_other_problems():
    with pytest.raises(ValueError) as error:
        parse_args_with_notes(BASE + ["--lr-decay-style", "wsd", "--tokenizer-type",
                                      "BertWordPieceLowerCase", "--frobnicate",
                                      "--fp8-format", "hybrid", "--num-layers", "four"])
    header, *lines = str(error.value).splitlines()
    assert header == "5 flags not taken:"
    flags = sorted(line.split()[0].rstrip(":") for line in lines)
    assert flags == ["--fp8-format", "--frobnicate", "--lr-decay-style", "--num-layers",
                     "--tokenizer-type"]
    tokenizer = next(line for line in lines if "--tokenizer-type" in line)
    assert "invalid choice" in tokenizer and "Llama2Tokenizer" in tokenizer
    assert "usage" not in str(error.value)


def _scalars(directory):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    reader = EventAccumulator(str(directory))
    reader.Reload()
    return {tag: [(e.step, e.value) for e in reader.Scalars(tag)]
            for tag in reader.Tags()["scalars"]}


def test_tensorboard_events_are_read_by_tensorboards_reader(tmp_path):
    logger = TrainingLogger(train_iters=4, tensorboard_dir=str(tmp_path), stream=io.StringIO(),
                            tensorboard_log_interval=2, log_timers_to_tensorboard=True,
                            log_validation_ppl_to_tensorboard=True, global_batch_size=8)
    for it in range(1, 5):
        logger.log({"iteration": it, "loss": 5.0 - it, "lr": 1e-3, "grad_norm": 0.5 * it,
                    "tokens_per_s": 100.0, "step_s": 0.25, "params_norm": 10.0 + it,
                    "num_zeros_in_grad": 7, "tflops_per_device": 1.5, "idle_s": [0.1, 0.2]})
    logger.log_eval({"iteration": 4, "eval_loss": 2.0, "eval_ppl": 7.389, "eval_tokens": 64})
    logger.close()
    scalars = _scalars(tmp_path)
    assert scalars["lm loss"] == [(2, 3.0), (4, 1.0)]  # every 2nd iteration
    assert scalars["params-norm"] == [(2, 12.0), (4, 14.0)]
    assert scalars["num-zeros"] == [(2, 7.0), (4, 7.0)]
    assert scalars["batch-size"] == [(2, 8.0), (4, 8.0)]
    assert scalars["iteration-time"] == [(2, 0.25), (4, 0.25)]
    assert scalars["lm loss validation"] == [(4, 2.0)]
    assert scalars["lm loss validation ppl"][0][0] == 4
    assert [s for s, _ in scalars["idle_s/rank1"]] == [2, 4]
