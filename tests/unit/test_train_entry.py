"""``python -m odc_pp.train`` is the one training entry point: ``pretrain_gpt.py`` (Megatron's
script name), the demo and the tests' torchrun launcher all run it. (That a ``pip
install``-ed copy trains: tests/e2e/wheel/test_pip_install.py.)"""

from __future__ import annotations

import os
import runpy
import subprocess
import sys

import pytest

import odc_pp.train
from odc_pp import demo
from odc_pp.testing import torchrun

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_pretrain_gpt_py_calls_odc_pp_train_main(monkeypatch):
    calls = []
    monkeypatch.setattr(odc_pp.train, "main", lambda argv=None: calls.append(argv) or 7)
    monkeypatch.setattr(sys, "argv", ["pretrain_gpt.py", "--train-iters", "1"])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(os.path.join(ROOT, "pretrain_gpt.py"), run_name="__main__")
    assert done.value.code == 7 and calls == [None]  # main reads sys.argv itself


def test_main_exits_2_naming_a_bad_flag(capsys):
    assert odc_pp.train.main(["--no-such-flag", "3"]) == 2
    assert "--no-such-flag" in capsys.readouterr().err


class _Captured(Exception):
    pass


def _command_of(monkeypatch, module, call) -> list[str]:
    """The command line ``call`` hands to ``module``'s subprocess.Popen (not started)."""
    seen = []

    def popen(command, **kwargs):
        seen.append(command)
        raise _Captured

    monkeypatch.setattr(module.subprocess, "Popen", popen)
    with pytest.raises(_Captured):
        call()
    return seen[0]


def test_the_launchers_run_the_module(monkeypatch, tmp_path):
    """The tests' torchrun launcher and the demo start ``torchrun ... -m odc_pp.train
    FLAGS``; an explicit script still replaces it (the zygote launcher: dist/test_zygote.py)."""
    tests = _command_of(monkeypatch, torchrun, lambda: torchrun.start(
        ["--train-iters", "1"], nproc=2, tmp_path=tmp_path, name="x", launcher="torchrun"))
    shown = _command_of(monkeypatch, demo, lambda: demo._torchrun(
        ["--train-iters", "1"], nproc=2, log=str(tmp_path / "l.jsonl"), timeout_s=1))
    for command in (tests, shown):
        at = command.index("-m", 3)
        assert command[1:3] == ["-m", "torch.distributed.run"]
        assert command[at:at + 3] == ["-m", "odc_pp.train", "--train-iters"], command
        assert not [part for part in command if part.endswith("pretrain_gpt.py")]
    own = _command_of(monkeypatch, torchrun, lambda: torchrun.start(
        [], nproc=1, tmp_path=tmp_path, name="y", script="other.py", log=False,
        launcher="torchrun"))
    assert "other.py" in own and "odc_pp.train" not in own


_PARSE_ONLY = """
import sys
import odc_pp.train
try:
    code = odc_pp.train.main(sys.argv[1:])
except SystemExit as done:  # --help
    code = done.code
loaded = sorted(m for m in ("torch", "megatron", "transformers") if m in sys.modules)
print("LOADED", ",".join(loaded) or "-", "CODE", code)
"""


@pytest.mark.parametrize("argv,code", [
    (["--bogus-flag"], 2),                                       # mistyped flag
    (["--pipeline-model-parallel-size", "3", "--mock-data"], 2),  # combination checks
    (["--help"], 0),
])
def test_flag_errors_and_help_come_before_torch_is_imported(argv, code):
    """A mistyped flag, a bad combination and --help are answered by the torch-free
    parser (odc_pp.training.flag_check), so under torchrun the first rank's error comes
    within a second, above the launcher's banner: at the answer neither torch nor
    megatron-core nor transformers is imported."""
    env = dict(os.environ, PYTHONPATH=ROOT, RANK="0", WORLD_SIZE="1")
    proc = subprocess.run([sys.executable, "-c", _PARSE_ONLY] + argv, capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.stdout.strip().splitlines()[-1] == f"LOADED - CODE {code}", proc.stderr
    if code:
        assert proc.stderr.startswith("pretrain_gpt.py: error:"), proc.stderr
    else:
        assert "--pipeline-schedule" in proc.stdout


def test_other_ranks_stay_quiet_on_bad_flags(monkeypatch, capsys):
    """Only the first rank prints the error (the others wait, then exit 2)."""
    from odc_pp.training import flag_check
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(flag_check, "PEER_WAIT_S", 0.0)
    assert flag_check.check_flags(["--bogus-flag"]) == 2
    assert capsys.readouterr().err == ""
