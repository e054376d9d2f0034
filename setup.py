"""Build script: installs the odc_pp package and builds
the one-sided transport extension ``odc_pp._C`` from csrc/ (see csrc/README.md).

CUDA backend ``odc_pp._C_cuda``: built when nvcc is on PATH, unless ``ODC_PP_NO_CUDA=1``
(the explicit opt-out for CPU-only builds); ``ODC_PP_NO_CUDA=0`` requires it (no nvcc is
then an error, as on a GPU machine). When nvcc exists and the CUDA build fails, the
build fails (the error is not swallowed). Building extensions without pybind11 is an
error, and so is a build that ends without the file of every extension it was to build. Architectures: ``ODC_PP_CUDA_ARCHS`` (e.g.
``"80;90"`` or ``"9.0 10.0"``; default sm_80/86/89/90 plus PTX of the newest, so newer GPUs
JIT it). cudart (static) is looked up in CUDA_HOME, /usr/local/cuda, next to nvcc and in
the pip-installed CUDA (the ``nvidia-cuda-runtime`` wheels' lib folders; linked
statically where libcudart_static.a exists, else against the shared libcudart with an rpath)."""

import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig

from setuptools import find_packages, setup

try:
    from pybind11.setup_helpers import Pybind11Extension, build_ext
except ImportError:  # pragma: no cover - pybind11 is a build requirement
    Pybind11Extension = None
    build_ext = None

CUDA_EXTENSION = "odc_pp._C_cuda"
NO_CUDA_ENV = "ODC_PP_NO_CUDA"
CUDA_ARCHS_ENV = "ODC_PP_CUDA_ARCHS"
DEFAULT_CUDA_ARCHS = ("80", "86", "89", "90")


def cuda_archs(value=None):
    """The compute capabilities to build for, as digit strings ("80", "90", "100")."""
    value = os.environ.get(CUDA_ARCHS_ENV, "") if value is None else value
    if not value.strip():
        return list(DEFAULT_CUDA_ARCHS)
    archs = []
    for item in re.split(r"[;,\s]+", value.strip()):
        digits = item.replace("sm_", "").replace("compute_", "").replace(".", "")
        digits = digits.removesuffix("+PTX").removesuffix("a")
        if not digits.isdigit() or len(digits) < 2:
            sys.exit(f"{CUDA_ARCHS_ENV}={value!r}: every entry must be a compute capability "
                     f"such as 80, 8.6 or sm_90, got {item!r}")
        archs.append(digits)
    return sorted(set(archs), key=int)


def gencode_flags(archs):
    """nvcc -gencode flags: SASS for every arch plus PTX of the newest."""
    flags = []
    for arch in archs:
        flags += ["-gencode", f"arch=compute_{arch},code=sm_{arch}"]
    flags += ["-gencode", f"arch=compute_{archs[-1]},code=compute_{archs[-1]}"]
    return flags


def pip_cuda_homes():
    """Roots of pip-installed CUDA runtimes (site-packages/nvidia/cuda_runtime, or
    nvidia/cu13 for the CUDA 13 wheels)."""
    roots = []
    for key in ("purelib", "platlib"):
        base = os.path.join(sysconfig.get_paths()[key], "nvidia")
        roots += sorted(glob.glob(os.path.join(base, "cuda_runtime")))
        roots += sorted(glob.glob(os.path.join(base, "cu[0-9]*")))
    return list(dict.fromkeys(roots))


def cuda_homes(nvcc):
    """CUDA roots to search for cudart: CUDA_HOME, /usr/local/cuda, nvcc's root (nvcc may
    be a wrapper script), then the pip-installed runtimes."""
    homes = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda",
             os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))] + pip_cuda_homes()
    return list(dict.fromkeys(home for home in homes if home))


def find_cudart(nvcc):
    """How to link cudart: (library_dirs, libraries, runtime_library_dirs). Static
    (libcudart_static.a, no runtime dependency) where a toolkit has it, else the shared
    libcudart.so[.N] (the pip wheels ship only that; torch loads the same library, and an
    rpath points at its folder). None when neither is found."""
    subs = ("lib64", "lib", os.path.join("targets", "x86_64-linux", "lib"))
    folders = [os.path.join(home, sub) for home in cuda_homes(nvcc) for sub in subs
               if os.path.isdir(os.path.join(home, sub))]
    static = [folder for folder in folders
              if os.path.exists(os.path.join(folder, "libcudart_static.a"))]
    if static:
        return static[:1], ["cudart_static", "dl", "rt", "pthread"], []
    for folder in folders:
        shared = sorted(glob.glob(os.path.join(folder, "libcudart.so*")), key=len)
        if shared:
            return [folder], [":" + os.path.basename(shared[0]), "dl", "rt", "pthread"], [folder]
    return None


def transport_extensions():
    """odc_pp._C (host backend, always) and odc_pp._C_cuda (CUDA IPC backend, only when
    nvcc is found and ODC_PP_NO_CUDA is not 1; its .cu file is compiled by
    TransportBuildExt)."""
    host_sources = sorted(glob.glob("csrc/host/*.cpp"))
    if not host_sources:
        return []
    if Pybind11Extension is None:
        sys.exit("setup.py: pybind11 is not importable, so odc_pp._C cannot be built: "
                 "pip install 'pybind11>=2.12' (a build requirement in pyproject.toml)")
    extensions = [Pybind11Extension("odc_pp._C", host_sources, include_dirs=["csrc/host"],
                                    cxx_std=17, extra_compile_args=["-O3", "-pthread"],
                                    extra_link_args=["-pthread", "-lrt"])]
    nvcc = shutil.which("nvcc")
    no_cuda = os.environ.get(NO_CUDA_ENV, "")
    if nvcc is None and no_cuda == "0":
        sys.exit(f"setup.py: {NO_CUDA_ENV}=0 requires the CUDA backend {CUDA_EXTENSION}, "
                 "but nvcc is not on PATH: put the CUDA toolkit's bin on PATH, or unset "
                 f"{NO_CUDA_ENV} (or set it to 1) for a CPU-only build")
    if nvcc and no_cuda != "1":
        cudart = find_cudart(nvcc)
        if cudart is None:
            sys.exit(f"nvcc is on PATH ({nvcc}) but cudart (libcudart_static.a or "
                     "libcudart.so) was found in none of CUDA_HOME, /usr/local/cuda, nvcc's "
                     "CUDA root or the pip-installed nvidia-cuda-runtime: set CUDA_HOME to a "
                     f"CUDA toolkit, or build without the CUDA backend with {NO_CUDA_ENV}=1")
        library_dirs, libraries, runtime_dirs = cudart
        extensions.append(Pybind11Extension(
            CUDA_EXTENSION, sorted(glob.glob("csrc/cuda/*.cpp")), include_dirs=["csrc/cuda"],
            cxx_std=17, extra_compile_args=["-O2"], library_dirs=library_dirs,
            libraries=libraries, runtime_library_dirs=runtime_dirs))
    return extensions


if build_ext is not None:
    class TransportBuildExt(build_ext):
        """Compiles csrc/cuda/*.cu with nvcc before linking odc_pp._C_cuda. A failure is
        an error (set ODC_PP_NO_CUDA=1 to build without the CUDA backend)."""

        def run(self):
            super().run()
            missing = [ext.name for ext in self.extensions
                       if not os.path.exists(self.get_ext_fullpath(ext.name))]
            if missing:
                raise RuntimeError(f"setup.py build_ext finished without {', '.join(missing)} "
                                   f"(expected {self.get_ext_fullpath(missing[0])}): the "
                                   "extension did not build")

        def build_extension(self, ext):
            if ext.name == CUDA_EXTENSION:
                ext.extra_objects = self._compile_cuda()
            return super().build_extension(ext)

        def _compile_cuda(self):
            objects = []
            os.makedirs(self.build_temp, exist_ok=True)
            arch_flags = gencode_flags(cuda_archs())
            for source in sorted(glob.glob("csrc/cuda/*.cu")):
                obj = os.path.join(self.build_temp, os.path.basename(source) + ".o")
                command = [shutil.which("nvcc"), "-O2", "-std=c++17", "-c", source, "-o", obj,
                           "-Xcompiler", "-fPIC", "-Icsrc/cuda"] + arch_flags
                print(" ".join(command))
                result = subprocess.run(command, check=False)
                if result.returncode != 0:
                    raise RuntimeError(
                        f"nvcc failed on {source} (exit {result.returncode}); fix the CUDA "
                        f"toolchain, choose architectures with {CUDA_ARCHS_ENV}, or build "
                        f"without the CUDA backend with {NO_CUDA_ENV}=1")
                objects.append(obj)
            return objects

    CMDCLASS = {"build_ext": TransportBuildExt}
else:  # pragma: no cover
    CMDCLASS = {}


if __name__ == "__main__":
    setup(
        packages=find_packages(include=["odc_pp", "odc_pp.*"]),
        ext_modules=transport_extensions(),
        cmdclass=CMDCLASS,
        zip_safe=False,
    )
