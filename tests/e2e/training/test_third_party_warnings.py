"""Third-party warnings in the training log: one line per kind, on the first rank only
(odc_pp.training.third_party_warnings)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import warnings

from odc_pp.training.third_party_warnings import ThirdPartyWarnings, warning_kind

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
SITE = os.path.join(os.sep, "venv", "lib", "python3.11", "site-packages")


def _warn(hook, message, filename, category=UserWarning, lineno=1):
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = hook
        warnings.warn_explicit(message, category, filename, lineno)


def test_one_line_per_kind_and_own_warnings_untouched():
    stream, own = io.StringIO(), []
    hook = ThirdPartyWarnings(stream=stream, fallback=lambda *a: own.append(a))
    te = os.path.join(SITE, "megatron", "core", "optimizer", "{}.py")
    for name, lineno in (("__init__", 24), ("optimizer", 28), ("clip_grads", 29)):
        _warn(hook, "Transformer Engine and Apex are not installed. Falling back to "
              f"local implementations ({name})", te.format(name), lineno=lineno)
    _warn(hook, "Apex is not installed. Falling back to Torch Norm",
          os.path.join(SITE, "megatron", "core", "models", "backends.py"))
    _warn(hook, "Apex is not installed. Falling back to Torch Norm",
          os.path.join(SITE, "megatron", "core", "models", "gpt", "specs.py"))
    _warn(hook, "Apex is not installed.", os.path.join(SITE, "torch", "x.py"),
          category=FutureWarning)
    _warn(hook, "ours", os.path.join(ROOT, "odc_pp", "training", "trainer.py"))
    lines = stream.getvalue().splitlines()
    assert lines == [
        "warning: megatron: UserWarning: Transformer Engine and Apex are not installed. "
        "Falling back to local implementations (__init__) (shown once)",
        "warning: megatron: UserWarning: Apex is not installed. Falling back to Torch Norm "
        "(shown once)",
        "warning: torch: FutureWarning: Apex is not installed. (shown once)"]
    assert len(own) == 1 and str(own[0][0]) == "ours"
    assert warning_kind("A b. C d.", UserWarning, te.format("x")) == (
        "megatron", "UserWarning", "A b")


def test_other_ranks_show_none():
    stream = io.StringIO()
    hook = ThirdPartyWarnings(stream=stream, show=False, fallback=lambda *a: None)
    _warn(hook, "Apex is not installed.", os.path.join(SITE, "megatron", "a.py"))
    assert stream.getvalue() == "" and sum(hook.seen.values()) == 1


_IMPORT_MEGATRON = """
from odc_pp.training.third_party_warnings import install_warning_filter
install_warning_filter()
import megatron.core.optimizer
import megatron.core.models.gpt.gpt_layer_specs
"""


def test_megatron_import_warnings_are_one_line_per_kind():
    """megatron-core's import warnings on CPU (Transformer Engine / Apex missing: several
    modules, two lines each) come out as one line per kind on rank 0, none on rank 1."""
    for rank in ("0", "1"):
        env = dict(os.environ, PYTHONPATH=ROOT, RANK=rank, WORLD_SIZE="2")
        env.pop("PYTHONWARNINGS", None)
        proc = subprocess.run([sys.executable, "-c", _IMPORT_MEGATRON], capture_output=True,
                              text=True, timeout=300, env=env)
        assert proc.returncode == 0, proc.stderr
        lines = proc.stderr.splitlines()
        if rank == "1":
            assert lines == []
            continue
        assert all(line.startswith("warning: ") for line in lines), lines
        kinds = [line.split(". ")[0] for line in lines]
        assert len(kinds) == len(set(kinds)), lines
        assert sum("Transformer Engine and Apex are not installed" in line
                   for line in lines) == 1, lines
