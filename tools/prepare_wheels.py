#!/usr/bin/env python3
"""Fill ``.whl/`` with the wheels the lent GPU machine needs and cannot download (it has no
network): ``pip download`` of each of :data:`WHEELS` for CPython 3.12 on manylinux x86_64,
without dependencies (the machine has torch, triton, numpy and transformers already;
docs/gpu.md). ``tools/gpu_oneshot.py`` installs them from there with ``pip install
--no-index --no-deps --find-links .whl``.

    python tools/prepare_wheels.py             # download into .whl/
    python tools/prepare_wheels.py --dry-run   # print the pip commands only
    python tools/prepare_wheels.py --check     # exit 1 naming each wheel .whl/ lacks

``.whl/`` is gitignored; carry it to the device (``carry: [".whl"]``).
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_DEST = os.path.join(ROOT, ".whl")
PYTHON_VERSION = "3.12"
"""The lent machine's interpreter (3.12.3)."""
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_24_x86_64", "manylinux2014_x86_64")
"""Platform tags pip may pick a binary wheel for."""


@dataclass(frozen=True, kw_only=True)
class Wheel:
    """One package the device installs from ``.whl/``."""

    spec: str
    """The pip requirement (pinned)."""
    pattern: str
    """The file name glob that shows it is in the folder."""
    why: str
    """What needs it on the device."""


WHEELS = (
    Wheel(spec="megatron-core==0.16.1", pattern="megatron_core-0.16.1-*.whl",
          why="every odc-pp training run (the setup stage)"),
    Wheel(spec="pybind11==3.1.0", pattern="pybind11-*.whl",
          why="setup.py build_ext (fails without it)"),
    Wheel(spec="liger-kernel==0.8.5", pattern="liger_kernel-0.8.5-*.whl",
          why="bench_cross_entropy.py's and bench_gpu_kernels.py's Liger rows"),
    Wheel(spec="cut-cross-entropy==25.1.1", pattern="cut_cross_entropy-25.1.1-*.whl",
          why="bench_cross_entropy.py's cut-cross-entropy row"),
)


def download_command(wheel: Wheel, dest: str, python: str = sys.executable) -> list[str]:
    """``pip download`` of one wheel for the device's interpreter and platform."""
    command = [python, "-m", "pip", "download", wheel.spec, "--no-deps",
               "--only-binary", ":all:", "--python-version", PYTHON_VERSION,
               "--implementation", "cp", "--dest", dest]
    for platform in PLATFORMS:
        command += ["--platform", platform]
    return command


def missing(dest: str) -> list[Wheel]:
    """The wheels ``dest`` does not hold."""
    return [wheel for wheel in WHEELS if not glob.glob(os.path.join(dest, wheel.pattern))]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", default=DEFAULT_DEST, help="the folder (default .whl/)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    parser.add_argument("--check", action="store_true",
                        help="only check that the folder holds every wheel")
    args = parser.parse_args(argv)
    if args.check:
        lacking = missing(args.dest)
        for wheel in lacking:
            print(f"{args.dest}: no {wheel.pattern} ({wheel.spec}; {wheel.why})",
                  file=sys.stderr)
        return 1 if lacking else 0
    failed = []
    for wheel in missing(args.dest) if not args.dry_run else WHEELS:
        command = download_command(wheel, args.dest)
        print(" ".join(command), flush=True)
        if args.dry_run:
            continue
        os.makedirs(args.dest, exist_ok=True)
        if subprocess.run(command, check=False).returncode != 0:
            failed.append(wheel.spec)
    if failed:
        print(f"prepare_wheels: pip download failed for {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
