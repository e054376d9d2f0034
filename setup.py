"""Build script: installs odc_pp and this repo's megatron.* namespace packages, and builds
the one-sided transport extension ``odc_pp._C`` from csrc/ (see csrc/README.md)."""

import glob
import os

from setuptools import find_namespace_packages, setup

try:
    from pybind11.setup_helpers import Pybind11Extension, build_ext
except ImportError:  # pragma: no cover - pybind11 is a build requirement
    Pybind11Extension = None
    build_ext = None


def transport_extensions():
    sources = sorted(glob.glob("csrc/**/*.cpp", recursive=True))
    if not sources or Pybind11Extension is None:
        return []
    return [Pybind11Extension("odc_pp._C", sources, include_dirs=["csrc"], cxx_std=17,
                              extra_compile_args=["-O3", "-pthread"],
                              extra_link_args=["-pthread", "-lrt"])]


setup(
    packages=find_namespace_packages(include=["odc_pp", "odc_pp.*", "megatron.training",
                                              "megatron.training.*"]),
    ext_modules=transport_extensions(),
    cmdclass={"build_ext": build_ext} if build_ext else {},
    zip_safe=False,
)
