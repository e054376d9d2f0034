"""A ``pip install``-ed odc-pp trains: ``pip install`` (not editable) of this checkout's
package into a fresh virtual environment outside the repository, then ``torchrun -m
odc_pp.train`` with the demo's tiny model from a directory outside the repository, with no
PYTHONPATH: two ranks of ODC data parallelism (the installed, freshly built ``odc_pp._C``)
train and log finite losses.

Offline and without re-downloading torch: the new environment has no pip and no packages
of its own; a ``.pth`` file adds this interpreter's site-packages after its own (a path
line in a ``.pth`` file does not run that folder's ``.pth`` files, so the checkout's
editable install stays invisible), and this interpreter's pip installs into it
(``pip --python``, ``--no-build-isolation``, host extension only). The package sources are
copied first, so the build writes nothing into the checkout. About 60 s to install (the
C++ build) and 30 s to train on 2 busy cores."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

from odc_pp.demo import TINY_MODEL

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))

pytestmark = pytest.mark.slow


def _site_packages(python: str) -> str:
    return subprocess.run([python, "-c", "import sysconfig; "
                           "print(sysconfig.get_paths()['purelib'])"], check=True,
                          capture_output=True, text=True, timeout=60).stdout.strip()


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> str:
    """The interpreter of a fresh venv holding a ``pip install``-ed odc-pp."""
    base = tmp_path_factory.mktemp("pip_install")
    assert not str(base.resolve()).startswith(ROOT + os.sep), base
    source, venv = base / "src", base / "venv"
    source.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), source / name)
    shutil.copytree(os.path.join(ROOT, "csrc"), source / "csrc")
    shutil.copytree(os.path.join(ROOT, "odc_pp"), source / "odc_pp",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = str(venv / "bin" / "python")
    with open(os.path.join(_site_packages(python), "odc_pp_test_deps.pth"), "w") as handle:
        handle.write(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "-q",
                    "--no-deps", "--no-build-isolation", "--no-index",
                    "--disable-pip-version-check", str(source)], check=True, cwd=base,
                   env=dict(os.environ, ODC_PP_NO_CUDA="1"), timeout=600)
    return python


def test_installed_odc_pp_trains_from_outside_the_repository(installed, tmp_path):
    package = os.path.join(_site_packages(installed), "odc_pp")
    assert os.path.exists(os.path.join(package, "train.py"))
    assert [n for n in os.listdir(package) if n.startswith("_C.")], "odc_pp._C not built"
    log = tmp_path / "log.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", TORCHELASTIC_ERROR_FILE="")
    command = [installed, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
               "2", "-m", "odc_pp.train", *TINY_MODEL, "--dp-mode", "odc",
               "--load-balance", "lb-mini", "--train-iters", "2", "--no-progress-bar",
               "--log-interval", "1", "--log-json", str(log),
               "--distributed-timeout-minutes", "2"]
    run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    described = f"exit {run.returncode}\n{run.stdout[-3000:]}\n{run.stderr[-4000:]}"
    assert run.returncode == 0, described
    assert run.stdout.count("| loss ") == 2, described
    losses = [json.loads(line)["loss"] for line in log.read_text().splitlines() if line]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses), losses
    # the run used the installed copy, not the checkout
    where = subprocess.run([installed, "-c", "import odc_pp.train as t; print(t.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert where.stdout.strip() == os.path.join(package, "train.py"), where.stderr
