"""Build script: installs the odc_pp package and builds
the one-sided transport extension ``odc_pp._C`` from csrc/ (see csrc/README.md)."""

import glob
import os
import shutil
import subprocess

from setuptools import find_packages, setup

try:
    from pybind11.setup_helpers import Pybind11Extension, build_ext
except ImportError:  # pragma: no cover - pybind11 is a build requirement
    Pybind11Extension = None
    build_ext = None

CUDA_EXTENSION = "odc_pp._C_cuda"


def cuda_library_dirs(nvcc):
    """Folders that may hold libcudart_static.a (nvcc may be a wrapper script)."""
    homes = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda",
             os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))]
    return [os.path.join(home, sub) for home in homes if home for sub in ("lib64", "lib")
            if os.path.exists(os.path.join(home, sub, "libcudart_static.a"))]


def transport_extensions():
    """odc_pp._C (host backend, always) and odc_pp._C_cuda (CUDA IPC backend, only when
    nvcc is found; its .cu file is compiled by TransportBuildExt)."""
    host_sources = sorted(glob.glob("csrc/host/*.cpp"))
    if not host_sources or Pybind11Extension is None:
        return []
    extensions = [Pybind11Extension("odc_pp._C", host_sources, include_dirs=["csrc/host"],
                                    cxx_std=17, extra_compile_args=["-O3", "-pthread"],
                                    extra_link_args=["-pthread", "-lrt"])]
    nvcc = shutil.which("nvcc")
    if nvcc and os.environ.get("ODC_PP_NO_CUDA", "0") != "1":
        extensions.append(Pybind11Extension(
            CUDA_EXTENSION, sorted(glob.glob("csrc/cuda/*.cpp")), include_dirs=["csrc/cuda"],
            cxx_std=17, extra_compile_args=["-O2"], library_dirs=cuda_library_dirs(nvcc),
            libraries=["cudart_static", "dl", "rt", "pthread"]))
    return extensions


if build_ext is not None:
    class TransportBuildExt(build_ext):
        """Compiles csrc/cuda/*.cu with nvcc (sm_90 + PTX) before linking odc_pp._C_cuda;
        if nvcc fails, prints a warning and skips the CUDA backend instead of failing."""

        def build_extension(self, ext):
            if ext.name != CUDA_EXTENSION:
                return super().build_extension(ext)
            try:
                ext.extra_objects = self._compile_cuda()
                super().build_extension(ext)
            except Exception as error:  # noqa: BLE001 - the CUDA backend is optional
                print(f"WARNING: not building {CUDA_EXTENSION} (CUDA backend): {error}")
                self._skipped = getattr(self, "_skipped", set()) | {ext.name}

        def copy_extensions_to_source(self):
            skipped = getattr(self, "_skipped", set())
            built = [ext for ext in self.extensions if ext.name not in skipped]
            self.extensions, everything = built, self.extensions
            try:
                super().copy_extensions_to_source()
            finally:
                self.extensions = everything

        def _compile_cuda(self):
            objects = []
            os.makedirs(self.build_temp, exist_ok=True)
            for source in sorted(glob.glob("csrc/cuda/*.cu")):
                obj = os.path.join(self.build_temp, os.path.basename(source) + ".o")
                command = [shutil.which("nvcc"), "-O2", "-std=c++17", "-c", source, "-o", obj,
                           "-Xcompiler", "-fPIC", "-Icsrc/cuda",
                           "-gencode", "arch=compute_90,code=sm_90",
                           "-gencode", "arch=compute_90,code=compute_90"]
                print(" ".join(command))
                subprocess.run(command, check=True)
                objects.append(obj)
            return objects

    CMDCLASS = {"build_ext": TransportBuildExt}
else:  # pragma: no cover
    CMDCLASS = {}


setup(
    packages=find_packages(include=["odc_pp", "odc_pp.*"]),
    ext_modules=transport_extensions(),
    cmdclass=CMDCLASS,
    zip_safe=False,
)
