"""Every numeric argument of ``odc-pp schedule`` and ``odc-pp tune-offload`` is bounded and
the work is capped (odc_pp/schedule/cli_bounds.py): out-of-range input is one error naming
the flag, at once."""

from __future__ import annotations

import pytest

from odc_pp.planner import offload_tuner
from odc_pp.schedule.cli import main
from odc_pp.schedule.cli_bounds import MAX_WORK

BASE = ["--pp", "4", "--microbatches", "8"]


@pytest.mark.parametrize("argv, expected", [
    (BASE + ["--cost-f", "1e308"], "argument --cost-f: '1e308': times must be finite numbers "
                                   "in [0, 1e+12], got 1e+308"),
    (["--pp", "99999999999999999999", "--microbatches", "8"],
     "argument --pp: must be in [1, 1024], got 99999999999999999999"),
    (["--pp", "4", "--microbatches", "100000"],
     "argument --microbatches: must be in [1, 8192], got 100000"),
    (["--pp", "1024", "--microbatches", "2048"],
     f"--pp 1024 x 2048 microbatches x 1 model chunks = 2097152 exceeds the limit of "
     f"{MAX_WORK}"),
    (["--pp", "64", "--microbatches", "256", "--compare"],
     "--pp 64 x 256 microbatches x 2 model chunks = 32768 exceeds the limit"),
    (BASE + ["--cost-comm", "1e300"], "argument --cost-comm: must be a finite number in [0, "
                                      "1e+12], got 1e300"),
    (BASE + ["--memory-limit", "0"], "argument --memory-limit: must be a finite number in "
                                     "(0, 1e+09], got 0"),
    (BASE + ["--mem-f", "1e300"], "argument --mem-f: must be a finite number in [-1e+06, "
                                  "1e+06], got 1e300"),
    (BASE + ["--max-evaluations", "1e9"], "argument --max-evaluations: '1e9' is not an "
                                          "integer"),
    (BASE + ["--width", "0"], "argument --width: must be in [20, 100000], got 0"),
    (BASE + ["--chunks", "1000"], "argument --chunks: must be in [1, 64], got 1000"),
])
def test_schedule_bounds(argv, expected, capsys):
    assert main(argv) == 2
    assert expected in capsys.readouterr().err


TUNE = ["--num-layers", "8", "--hidden-size", "512", "--num-attention-heads", "8",
        "--seq-length", "1024", "--num-microbatches", "8", "--preset", "h100"]


@pytest.mark.parametrize("argv, expected", [
    (TUNE + ["--pp", "0"], "argument --pp: must be in [1, 1024], got 0"),
    (TUNE + ["--pp", "4", "--top", "0"], "argument --top: must be in [1, 10000], got 0"),
    (TUNE + ["--pp", "4", "--mfu", "2"], "argument --mfu: must be a finite number in (0, 1]"),
    (TUNE + ["--pp", "4", "--seq-length", "1e12"], "argument --seq-length: '1e12' is not an "
                                                   "integer"),
])
def test_tune_offload_bounds(argv, expected, capsys):
    with pytest.raises(SystemExit) as caught:
        offload_tuner.main(argv)
    assert caught.value.code == 2
    assert expected in capsys.readouterr().err


def test_tune_offload_caps_the_work(capsys):
    argv = TUNE[:-4] + ["--num-microbatches", "4096", "--preset", "h100", "--pp", "1024"]
    assert offload_tuner.main(argv) == 2
    assert "exceeds the limit of" in capsys.readouterr().err
