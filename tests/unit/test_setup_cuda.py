"""setup.py's CUDA build settings: the architecture list and its ODC_PP_CUDA_ARCHS override,
the nvcc -gencode flags (SASS per arch + PTX of the newest) and the cudart lookup."""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location("odc_setup", os.path.join(ROOT, "setup.py"))
build_script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build_script)  # setup() itself runs only under __main__


def test_default_archs_are_ampere_to_hopper(monkeypatch):
    monkeypatch.delenv("ODC_PP_CUDA_ARCHS", raising=False)
    assert build_script.cuda_archs() == ["80", "86", "89", "90"]


@pytest.mark.parametrize("value,expected", [("90", ["90"]), ("8.0;9.0", ["80", "90"]),
                                            ("sm_90, 100 86", ["86", "90", "100"]),
                                            ("9.0+PTX 90a", ["90"])])
def test_arch_override(value, expected):
    assert build_script.cuda_archs(value) == expected


def test_bad_arch_names_the_variable():
    with pytest.raises(SystemExit, match="ODC_PP_CUDA_ARCHS"):
        build_script.cuda_archs("ampere")


def test_gencode_flags_embed_ptx_of_the_newest_arch():
    flags = build_script.gencode_flags(["80", "90"])
    assert flags == ["-gencode", "arch=compute_80,code=sm_80",
                     "-gencode", "arch=compute_90,code=sm_90",
                     "-gencode", "arch=compute_90,code=compute_90"]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on PATH")
def test_cudart_is_found_next_to_nvcc():
    found = build_script.find_cudart(shutil.which("nvcc"))
    assert found is not None
    library_dirs, libraries, _ = found
    assert library_dirs and ("cudart_static" in libraries or libraries[0].startswith(":"))
