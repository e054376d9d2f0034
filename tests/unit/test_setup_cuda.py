"""setup.py's CUDA build settings: the architecture list and its ODC_PP_CUDA_ARCHS override,
the nvcc -gencode flags (SASS per arch + PTX of the newest) and the cudart lookup."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys

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


# ----- the build fails loudly (issue 50, item 5) ---------------------------------------------

def test_setup_without_pybind11_fails_naming_it(tmp_path):
    """`setup.py build_ext` with pybind11 unimportable exits non-zero and says why (it used
    to exit 0 having built nothing)."""
    blocker = tmp_path / "block" / "pybind11"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('blocked by the test')\n")
    work = tmp_path / "src"
    work.mkdir()
    shutil.copy(os.path.join(ROOT, "setup.py"), work / "setup.py")
    shutil.copytree(os.path.join(ROOT, "csrc"), work / "csrc")
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["PYTHONPATH"] = str(tmp_path / "block")
    done = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=work,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "pybind11 is not importable" in done.stderr + done.stdout
    assert not list(work.rglob("_C*.so"))


def test_cuda_required_without_nvcc_is_an_error(monkeypatch):
    """ODC_PP_NO_CUDA=0 (what the GPU build stage sets) with no nvcc: one error naming the
    variable, not a silent CPU-only build."""
    monkeypatch.setenv("ODC_PP_NO_CUDA", "0")
    monkeypatch.setattr(build_script.shutil, "which", lambda name: None)
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit, match="ODC_PP_NO_CUDA=0 requires the CUDA backend"):
        build_script.transport_extensions()


def test_cpu_build_without_nvcc_is_allowed(monkeypatch):
    monkeypatch.delenv("ODC_PP_NO_CUDA", raising=False)
    monkeypatch.setattr(build_script.shutil, "which", lambda name: None)
    monkeypatch.chdir(ROOT)
    assert [ext.name for ext in build_script.transport_extensions()] == ["odc_pp._C"]


def test_build_that_leaves_no_extension_file_fails(tmp_path, monkeypatch):
    """A build_ext run that ends without an extension's file raises, naming it."""
    from setuptools import Distribution, Extension
    monkeypatch.chdir(tmp_path)
    dist = Distribution({"ext_modules": [Extension("odc_pp._C", ["missing.cpp"])]})
    command = build_script.TransportBuildExt(dist)
    command.inplace = True
    command.ensure_finalized()
    parent = build_script.TransportBuildExt.__mro__[1]
    monkeypatch.setattr(parent, "run", lambda self: None)  # compiles nothing
    with pytest.raises(RuntimeError, match="without odc_pp._C"):
        command.run()
