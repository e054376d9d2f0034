"""Flags pasted from Megatron-LM scripts: each is honoured (with a note), mapped to odc-pp's
equivalent (with a note) or rejected naming the equivalent; none is silently ignored."""

import pytest

from odc_pp.training.arguments import build_parser, parse_args_with_notes
from odc_pp.training.megatron_flags import PASTED_FLAGS, translate

BASE = ["--mock-data", "--vocab-size", "64"]
ISSUE_FLAGS = ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
               "--transformer-impl", "--recompute-granularity", "--calculate-per-token-loss",
               "--use-flash-attn", "--untie-embeddings-and-output-weights"]


def test_every_flag_of_the_issue_is_in_the_table_and_not_a_native_flag():
    native = {option for action in build_parser()._actions for option in action.option_strings}
    for flag in ISSUE_FLAGS:
        assert flag in PASTED_FLAGS
    assert not native & set(PASTED_FLAGS), "a pasted flag shadows a native one"


@pytest.mark.parametrize("flag", ["--use-distributed-optimizer", "--overlap-grad-reduce",
                                  "--overlap-param-gather", "--calculate-per-token-loss"])
def test_honoured_flags_leave_a_note_and_change_nothing(flag):
    args, notes = parse_args_with_notes(BASE + [flag])
    plain, plain_notes = parse_args_with_notes(BASE)
    assert args == plain
    extra = [note for note in notes if note not in plain_notes]
    assert len(extra) == 1 and extra[0].startswith(f"note: {flag}:")


def test_untie_maps_to_the_native_flag():
    args, notes = parse_args_with_notes(BASE + ["--untie-embeddings-and-output-weights"])
    assert args.model.untie_embeddings and "--untie-embeddings" in notes[0]


def test_value_flags_honoured_mapped_or_rejected():
    args, notes = parse_args_with_notes(BASE + ["--transformer-impl", "local"])
    assert notes and "local" in notes[0]
    args, notes = parse_args_with_notes(BASE + ["--recompute-granularity=selective"])
    assert args.model.recompute_lgd and "--recompute-lgd" in notes[0]
    with pytest.raises(ValueError, match="--transformer-impl local"):
        parse_args_with_notes(BASE + ["--transformer-impl", "transformer_engine"])
    args, notes = parse_args_with_notes(BASE + ["--recompute-granularity", "full",
                                                "--recompute-method", "block",
                                                "--recompute-num-layers", "2"])
    assert args.model.recompute_full and "--recompute-full" in notes[0]
    assert (args.model.recompute_method, args.model.recompute_num_layers) == ("block", 2)
    with pytest.raises(ValueError, match="--recompute-method"):
        parse_args_with_notes(BASE + ["--recompute-granularity", "full"])
    with pytest.raises(ValueError, match="--recompute-granularity"):
        parse_args_with_notes(BASE + ["--recompute-granularity", "partial"])


@pytest.mark.parametrize("flag,equivalent", [("--use-flash-attn", "drop the flag")])
def test_rejected_flags_name_what_to_use(flag, equivalent):
    with pytest.raises(ValueError, match=equivalent):
        parse_args_with_notes(BASE + [flag])


def test_tensor_and_sequence_parallel_flags():
    args, _ = parse_args_with_notes(BASE + ["--tensor-model-parallel-size", "2",
                                            "--sequence-parallel", "--keep-sp-input-for-w"])
    assert args.parallel.tensor_model_parallel_size == 2
    assert args.parallel.sequence_parallel and args.parallel.keep_sp_input_for_w
    args, notes = parse_args_with_notes(BASE + ["--sequence-parallel"])  # as Megatron
    assert not args.parallel.sequence_parallel
    assert any(n.startswith("note: --sequence-parallel at --tensor-model-parallel-size 1: "
                            "no-op") for n in notes)
    with pytest.raises(ValueError, match="--keep-sp-input-for-w needs --sequence-parallel"):
        parse_args_with_notes(BASE + ["--tensor-model-parallel-size", "2",
                                      "--keep-sp-input-for-w"])


def test_translate_keeps_other_tokens_and_their_order():
    argv = ["--num-layers", "4", "--overlap-grad-reduce", "--lr", "1e-3"]
    out, notes = translate(argv)
    assert out == ["--num-layers", "4", "--lr", "1e-3"] and len(notes) == 1
    with pytest.raises(ValueError, match="--transformer-impl expects 1 value"):
        translate(["--transformer-impl"])
    with pytest.raises(ValueError, match="--transformer-impl expects 1 value"):
        translate(["--transformer-impl", "--bf16"])


@pytest.mark.parametrize("lr", ["-1e-3", "inf", "nan"])
def test_lr_must_be_finite_and_non_negative(lr):
    with pytest.raises(ValueError, match=r"--lr \S+ must be finite and >= 0") as error:
        parse_args_with_notes(BASE + [f"--lr={lr}"])
    assert "--min-lr" not in str(error.value)


def test_lr_zero_is_allowed_with_a_warning():
    args, notes = parse_args_with_notes(BASE + ["--lr", "0"])
    assert args.optimizer.lr == 0 and any(note.startswith("warning: --lr 0") for note in notes)


def test_size_dependent_combinations_fail_before_training():
    """Collective + LB-Mini with a two-chunk schedule used to train 32 iterations and crash
    at the first plan with unequal microbatch counts."""
    from odc_pp.training.arguments import parse_args

    args = parse_args(BASE + ["--dp-mode", "collective", "--load-balance", "lb-mini",
                              "--pipeline-schedule", "zbv", "--pipeline-model-parallel-size",
                              "2", "--num-layers", "4"])
    with pytest.raises(ValueError, match="--load-balance balanced or none, --dp-mode odc"):
        args.resolve(4).layout.dp
    assert args.resolve(2).layout.dp == 1  # dp=1: nothing to balance
    hierarchical = parse_args(BASE + ["--dp-mode", "hierarchical", "--dp-ranks-per-host", "3"])
    with pytest.raises(ValueError, match="--dp-ranks-per-host 3"):
        hierarchical.resolve(4, 4).layout.dp
