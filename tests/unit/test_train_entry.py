"""``python -m odc_pp.train`` is the one training entry point: ``pretrain_gpt.py`` (Megatron's
script name), the demo and the tests' torchrun launcher all run it. (That a ``pip
install``-ed copy trains: tests/e2e/wheel/test_pip_install.py.)"""

from __future__ import annotations

import os
import runpy
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
