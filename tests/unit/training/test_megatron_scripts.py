"""Megatron-LM launch scripts pasted as they are (tests/data/megatron_scripts, shrunk in
size only): every flag is answered, all refusals come in one launch, one line each, and
with what each refusal names to use the job parses."""

import pathlib

import pytest

from odc_pp.training.arguments import build_parser, parse_args_with_notes
from odc_pp.training.megatron_flags import PASTED_FLAGS, outcome

DATA = pathlib.Path(__file__).resolve().parents[2] / "data" / "megatron_scripts"
NATIVE = frozenset(o for action in build_parser()._actions for o in action.option_strings)
SHRINK = {"--num-layers": "4", "--hidden-size": "64", "--ffn-hidden-size": "128",
          "--num-attention-heads": "4", "--num-query-groups": "2", "--kv-channels": "16",
          "--seq-length": "64", "--max-position-embeddings": "64", "--vocab-size": "128",
          "--padded-vocab-size": "128", "--global-batch-size": "8", "--train-iters": "4",
          "--lr-decay-iters": "4", "--train-samples": "32", "--lr-decay-samples": "32",
          "--lr-warmup-samples": "8", "--tensor-model-parallel-size": "1",
          "--pipeline-model-parallel-size": "2", "--rampup-batch-size": "2 2 16",
          "--num-layers-per-virtual-pipeline-stage": "1"}
# script -> {refused flag: the tokens its message says to use instead}
SCRIPTS = {
    "train_llama3_8b_h100_fp8": {},
    "train_gpt3_175b_distributed": {},
    "modelopt_finetune_qwen2.5_0.5b": {},
    "train_llama3_8b_h200_bf16": {},
    "sft_llama2_7b": {},
}


def read_flags(name: str) -> list[list[str]]:
    """The script's flags, each with its values, as in tests/data."""
    text = (DATA / f"{name}.flags").read_text(encoding="utf-8")
    return [line.split() for line in text.splitlines() if line.strip()]


def shrunk(flags: list[list[str]], tmp_path) -> list[list[str]]:
    """Sizes shrunk, $PATHS filled in (the tokenizer files exist, empty)."""
    for name in ("vocab_file", "merge_file"):
        (tmp_path / name).touch()
    (tmp_path / "tokenizer_model").mkdir(exist_ok=True)
    if not (tmp_path / "dataset.jsonl").exists():
        (tmp_path / "dataset.jsonl").write_text('{"text": "x"}\n')
    out = []
    for tokens in flags:
        tokens = [_fill(t, tmp_path) for t in tokens]
        if tokens[0] in SHRINK:
            tokens = [tokens[0], *SHRINK[tokens[0]].split()]
        out.append(tokens)
    return out


def _fill(token: str, tmp_path) -> str:
    """A ``$NAME`` as a path under ``tmp_path`` (``$DATASET``: a local JSONL file)."""
    if not token.startswith("$"):
        return token
    return str(tmp_path / ("dataset.jsonl" if token == "$DATASET" else token[1:].lower()))


def argv_of(flags: list[list[str]]) -> list[str]:
    return [token for tokens in flags for token in tokens]


def test_every_flag_of_megatron_examples_is_answered():
    names = (DATA / "examples_flag_names.txt").read_text(encoding="utf-8").split()
    assert len(names) > 150
    unanswered = [name for name in names if outcome([name], NATIVE)[0] == "unknown"]
    assert unanswered == []


def test_the_table_does_not_shadow_native_flags():
    assert not NATIVE & set(PASTED_FLAGS), "a pasted flag shadows a native one"


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_flag_of_the_script_is_answered_as_the_table_says(script):
    flags = read_flags(script)
    context = argv_of(flags)
    outcomes = {tokens[0]: outcome(tokens, NATIVE, context) for tokens in flags}
    assert all(action != "unknown" for action, _ in outcomes.values()), outcomes
    assert {f for f, (action, _) in outcomes.items() if action == "rejected"} == \
        set(SCRIPTS[script])
    assert all(note for action, note in outcomes.values() if action != "native")


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_starts_with_one_line_per_refusal_then_parses(script, tmp_path):
    flags = shrunk(read_flags(script), tmp_path)
    refused = SCRIPTS[script]
    if refused:
        with pytest.raises(ValueError) as error:
            parse_args_with_notes(argv_of(flags))
        header, *lines = str(error.value).splitlines()
        assert header == f"{len(refused)} flag{'s' * (len(refused) > 1)} not taken:"
        assert sorted(line.split()[0].rstrip(":") for line in lines) == sorted(refused)
        assert "usage" not in str(error.value)
    fixed = []
    for tokens in flags:
        if tokens[0] in refused:
            tokens = [_fill(t, tmp_path) for t in refused[tokens[0]]]
        fixed += tokens
    args, notes = parse_args_with_notes(fixed)
    pp, tp = args.parallel.pipeline_model_parallel_size, args.parallel.tensor_model_parallel_size
    args.resolve(pp * tp * 2).layout.dp
    answered = [tokens[0] for tokens in flags if tokens[0] not in NATIVE and
                tokens[0] not in refused]
    for flag in answered:
        assert any(note.startswith(f"note: {flag}") for note in notes), flag


def test_llama_script_shrunk_resolves_samples_and_sizes(tmp_path):
    fixed = [t for t in shrunk(read_flags("train_llama3_8b_h100_fp8"), tmp_path)
             if t[0] not in SCRIPTS["train_llama3_8b_h100_fp8"]]
    args, notes = parse_args_with_notes(argv_of(fixed))
    assert (args.run.train_iters, args.optimizer.lr_decay_iters,
            args.optimizer.lr_warmup_iters) == (4, 4, 1)  # 32, 32, 8 samples / 8
    assert args.model.init_method_std == 0.0134 and args.model.untie_embeddings
    assert not args.parallel.sequence_parallel and args.data.split is None
    assert args.logging.trace == "profile_trace.json"
    assert args.model.attention_backend == "auto"
    assert args.model.apply_layernorm_1p  # zero-centred norms, as Megatron
    assert (args.optimizer.decoupled_lr, args.optimizer.decoupled_min_lr) == (5.0e-4, 4.5e-5)


def test_fp8_flags_are_refused_with_the_reason(tmp_path):
    fp8 = read_flags("train_llama3_8b_h100_fp8.dtype_fp8")
    fixed = [t for t in shrunk(read_flags("train_llama3_8b_h100_fp8"), tmp_path)
             if t[0] not in SCRIPTS["train_llama3_8b_h100_fp8"]]
    with pytest.raises(ValueError) as error:
        parse_args_with_notes(argv_of(fixed + fp8))
    lines = str(error.value).splitlines()[1:]
    assert [line.split()[0].rstrip(":") for line in lines] == [tokens[0] for tokens in fp8]
    assert all("bf16 only; Transformer Engine FP8 is not supported" in line
               for line in lines)


def test_hf_dataset_is_a_local_jsonl_file_or_one_line_naming_the_flag(tmp_path):
    flags = shrunk(read_flags("modelopt_finetune_qwen2.5_0.5b"), tmp_path)
    args, notes = parse_args_with_notes(argv_of(flags))
    assert args.data.data_path == [str(tmp_path / "dataset.jsonl")]
    hub = [["--finetune-hf-dataset", "Magpie-Align/Magpie-Pro-MT-300K-v0.1"] if
           t[0] == "--finetune-hf-dataset" else t for t in flags]
    with pytest.raises(ValueError) as error:
        parse_args_with_notes(argv_of(hub))
    header, line = str(error.value).splitlines()
    assert line.strip().startswith("--finetune-hf-dataset Magpie-Align/Magpie-Pro-MT-300K-v0.1:")
    assert "downloads nothing" in line
