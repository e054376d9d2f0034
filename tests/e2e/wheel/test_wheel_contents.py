"""The project's wheel must not collide with any megatron-core release it may be installed
beside: no file path in our wheel may be one that megatron-core 0.16.x-0.19.x ships, and we
ship no ``megatron/__init__.py`` (which would shadow megatron-core's namespace).

The megatron-core file lists are test data (``megatron_core_files/<version>.txt``), read off
the cp312 manylinux wheels on PyPI with ``zipfile.ZipFile(...).namelist()``."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import zipfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
MEGATRON_CORE_LISTS = sorted(glob.glob(os.path.join(HERE, "megatron_core_files", "*.txt")))


def _megatron_core_files(path: str) -> set[str]:
    with open(path) as handle:
        return {line.strip() for line in handle if line.strip()}


@pytest.fixture(scope="module")
def wheel_files(tmp_path_factory) -> list[str]:
    """Build the wheel from this checkout (host extension only) and list its files."""
    out = tmp_path_factory.mktemp("wheel")
    env = dict(os.environ, ODC_PP_NO_CUDA="1")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "--disable-pip-version-check", "-w", str(out),
                    ROOT], check=True, env=env, timeout=900)
    wheels = glob.glob(os.path.join(out, "odc_pp-*.whl"))
    assert len(wheels) == 1, wheels
    with zipfile.ZipFile(wheels[0]) as wheel:
        return [name for name in wheel.namelist() if not name.endswith("/")]


def test_megatron_core_lists_cover_the_supported_range():
    versions = {os.path.basename(path)[:-4] for path in MEGATRON_CORE_LISTS}
    assert {"0.16.1", "0.17.0", "0.18.0", "0.19.0", "0.19.2"} <= versions
    # 0.17+ ship megatron/training themselves: the reason our frontend left that path.
    assert any(name.startswith("megatron/training/")
               for name in _megatron_core_files(os.path.join(HERE, "megatron_core_files",
                                                             "0.19.2.txt")))


@pytest.mark.slow
def test_wheel_ships_nothing_megatron_core_ships(wheel_files):
    ours = set(wheel_files)
    assert any(name.startswith("odc_pp/training/") for name in ours), "frontend not shipped"
    assert "odc_pp/_C" in {name.split(".")[0] for name in ours}, "host extension not shipped"
    assert "megatron/__init__.py" not in ours
    assert not [name for name in ours if name.startswith("megatron/")]
    for path in MEGATRON_CORE_LISTS:
        clash = sorted(ours & _megatron_core_files(path))
        assert not clash, f"megatron-core {os.path.basename(path)[:-4]} also ships {clash[:5]}"
