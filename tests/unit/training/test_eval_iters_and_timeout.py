"""Issue 53 item 8: --distributed-timeout-minutes nan is a flag error, and an --eval-iters
larger than the validation data is warned about at start-up (Megatron's meaning kept:
each evaluation still runs --eval-iters batches, cycling the data)."""

import json

import pytest

from odc_pp.training.arguments import parse_args
from odc_pp.training.data_plan import build_valid_source
from odc_pp.training.evaluation import eval_size_note, samples_in


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0"])
def test_a_timeout_that_is_not_a_positive_finite_number_is_a_flag_error(value):
    with pytest.raises(ValueError) as caught:
        parse_args(["--mock-data", "--vocab-size", "64", "--distributed-timeout-minutes", value])
    assert "--distributed-timeout-minutes must be a positive finite number of minutes, got " \
        in str(caught.value)
    assert parse_args(["--mock-data", "--vocab-size", "64", "--distributed-timeout-minutes",
                       "0.5"]).parallel.distributed_timeout_minutes == 0.5


def _jsonl(path, count: int) -> str:
    with open(path, "w") as handle:
        for index in range(count):
            handle.write(json.dumps({"text": "w" * (index + 1)}) + "\n")
    return str(path)


def test_eval_iters_beyond_the_validation_data_is_warned_about(tmp_path):
    data = _jsonl(tmp_path / "data.jsonl", 50)
    flags = ["--data-path", data, "--seq-length", "64", "--split", "80,20,0",
             "--global-batch-size", "4"]
    args = parse_args(flags + ["--eval-iters", "1000000"])
    valid = build_valid_source(args)
    assert samples_in(valid) == 10
    note = eval_size_note(args, valid)
    assert note == ("warning: --eval-iters 1000000 x --global-batch-size 4 = 4000000 samples "
                    "per evaluation, but the validation data holds 10: each evaluation reads "
                    "it 4e+05 times over (cycling, as Megatron does). --eval-iters 2 reads "
                    "each sample at most once")
    args = parse_args(flags + ["--eval-iters", "2"])
    assert eval_size_note(args, build_valid_source(args)) is None
    # a blended --valid-data-path counts every dataset of the blend
    other = _jsonl(tmp_path / "other.jsonl", 6)
    args = parse_args(["--data-path", data, "--seq-length", "64", "--global-batch-size", "4",
                       "--valid-data-path", "0.5", data, "0.5", other, "--eval-iters", "20"])
    valid = build_valid_source(args)
    assert samples_in(valid) == 56
    assert "but the validation data holds 56:" in eval_size_note(args, valid)
    mock = parse_args(["--mock-data", "--vocab-size", "64", "--eval-iters", "1000000"])
    assert eval_size_note(mock, build_valid_source(mock)) is None  # endless synthetic data
