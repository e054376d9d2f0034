"""JSONL records that give no sample are counted, named (file:line) and an error above
--max-dropped-records-fraction (issue 53 item 7); samples that truncation left with no
scored token are counted and kept, or dropped with --drop-unscored-samples (issue 51
item 6)."""

import json

import pytest

from odc_pp.data.datasets import JsonlDataset
from odc_pp.data.record_checks import data_notes
from odc_pp.data.tokenizers import build_tokenizer
from odc_pp.training.arguments import parse_args
from odc_pp.training.data_plan import BatchAssigner, build_source

TOKENIZER = build_tokenizer("ByteLevelTokenizer", None)


def _chat(user: str, reply: str, role: str = "assistant") -> dict:
    return {"messages": [{"role": "user", "content": user}, {"role": role, "content": reply}]}


def _write(path, records) -> str:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return str(path)


def test_gemma_roles_drop_half_the_file_and_fail_naming_the_lines(tmp_path):
    records = [_chat("hi", "hello", role="model" if k % 2 else "assistant") for k in range(200)]
    path = _write(tmp_path / "gemma.jsonl", records)
    with pytest.raises(ValueError) as caught:
        JsonlDataset([path], TOKENIZER, 64)
    assert str(caught.value).startswith(
        f"100 of 200 records of --data-path {path} give no sample: {path}:2 (unknown role "
        f"'model' (chat roles are system, developer, user, assistant, tool, function, "
        f"ipython; Gemma's 'model' is 'assistant')), {path}:4 (unknown role 'model'")
    assert f"{path}:6 (unknown role 'model'" in str(caught.value)
    assert "and 97 more; that is 50.0%, more than --max-dropped-records-fraction 0.01" in \
        str(caught.value)
    dataset = JsonlDataset([path], TOKENIZER, 64, max_dropped_fraction=0.5)
    assert len(dataset) == 100
    assert data_notes(dataset)[0].startswith(
        f"data: 100 of 200 records of --data-path {path} give no sample: {path}:2")


def test_a_role_typo_and_a_missing_reply_are_dropped_and_named(tmp_path):
    no_reply = {"messages": [{"role": "system", "content": "s"},
                             {"role": "user", "content": "q"}]}
    records = [_chat("q", "a")] * 197 + [
        {"messages": [{"role": "user", "content": "q"}, {"role": "assitant", "content": "a"},
                      {"role": "assistant", "content": "b"}]}, no_reply, no_reply]
    path = _write(tmp_path / "typo.jsonl", records)
    with pytest.raises(ValueError, match=rf"3 of 200 records of --data-path {path} give no "
                       rf"sample: {path}:198 \(unknown role 'assitant' .*\), {path}:199 \(no "
                       rf"assistant turn \(only assistant replies are scored\)\), {path}:200 "
                       rf"\(no assistant turn .*; that is 1.5%"):
        JsonlDataset([path], TOKENIZER, 64)
    # one record of 200 (0.5%) is under the default 1%: trained without it, and named
    path = _write(tmp_path / "one.jsonl", records[:198] + [_chat("q", "a")] * 2)
    dataset = JsonlDataset([path], TOKENIZER, 64)
    assert len(dataset) == 199
    assert data_notes(dataset) == [f"data: 1 of 200 records of --data-path {path} give no "
                                   f"sample: {path}:198 (unknown role 'assitant' (chat roles "
                                   f"are system, developer, user, assistant, tool, function, "
                                   f"ipython; Gemma's 'model' is 'assistant'))"]


def test_blended_files_are_each_checked(tmp_path):
    good = _write(tmp_path / "good.jsonl", [_chat("q", "a")] * 10)
    bad = _write(tmp_path / "bad.jsonl", [_chat("q", "a")] * 9 + [_chat("q", "a", role="model")])
    with pytest.raises(ValueError, match=rf"1 of 10 records of --data-path {bad} give no "
                       rf"sample: {bad}:10 \(unknown role 'model'"):
        build_source(parse_args(["--data-path", "0.5", good, "0.5", bad, "--seq-length", "64"]))


def _long_prompts(tmp_path) -> str:
    """20 conversations; the prompts of 15 fill --seq-length 128 before the reply."""
    return _write(tmp_path / "long.jsonl",
                  [_chat("q" * (60 + 10 * k), "a" * 20) for k in range(20)])


def test_samples_truncated_to_no_scored_token_are_counted(tmp_path):
    path = _long_prompts(tmp_path)
    flags = ["--data-path", path, "--seq-length", "128"]
    source, _ = build_source(parse_args(flags))
    unscored = [line for line in range(1, 21)
                if source.dataset.samples[line - 1].num_loss_tokens == 0]
    assert len(source.dataset) == 20 and unscored == list(range(6, 21))
    assert data_notes(source) == [
        f"data: 15 of 20 samples of --data-path {path} lost every scored token to truncation "
        f"at --seq-length 128 (kept: they train nothing, and a global batch of only such "
        f"samples stops the run; --drop-unscored-samples drops them): "
        f"{path}:6, {path}:7, {path}:8 and 12 more"]
    source, _ = build_source(parse_args(flags + ["--drop-unscored-samples"]))
    assert len(source.dataset) == 5
    assert all(sample.num_loss_tokens > 0 for sample in source.dataset.samples)
    assert data_notes(source)[0].startswith(
        f"data: 15 of 20 samples of --data-path {path} lost every scored token to "
        f"truncation at --seq-length 128 (dropped (--drop-unscored-samples)): {path}:6")


def test_a_global_batch_of_unscored_samples_stops_naming_the_flag(tmp_path):
    path = _long_prompts(tmp_path)
    flags = ["--data-path", path, "--seq-length", "128", "--global-batch-size", "1"]
    args = parse_args(flags)
    source, _ = build_source(args)
    batches = BatchAssigner(args, source, dp=1, pp=1)
    outcomes = []
    for iteration in range(20):
        try:
            outcomes.append(batches.plan(iteration).total_loss_tokens > 0)
        except ValueError as exc:
            assert str(exc).startswith(f"global batch {iteration} (samples {iteration}-"
                                       f"{iteration}) has no scored token: truncation at "
                                       f"--seq-length 128 cut off every scored token")
            assert str(exc).endswith("give --drop-unscored-samples or a longer --seq-length")
            outcomes.append(False)
    assert outcomes.count(False) == 15
    args = parse_args(flags + ["--drop-unscored-samples"])
    batches = BatchAssigner(args, build_source(args)[0], dp=1, pp=1)
    assert all(batches.plan(iteration).total_loss_tokens > 0 for iteration in range(20))


def test_the_dropped_fraction_flag_is_checked():
    with pytest.raises(ValueError, match=r"--max-dropped-records-fraction must be in \[0, 1\], "
                                         r"got nan"):
        parse_args(["--mock-data", "--vocab-size", "64", "--max-dropped-records-fraction",
                    "nan"])
