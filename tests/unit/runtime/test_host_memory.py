"""keep_freed_host_memory: glibc accepts the settings (mallopt returns 1 for each, twice),
so a CPU run keeps freed activation blocks instead of page-faulting them in again. Run in
a subprocess: the settings are process-wide."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_glibc_takes_the_settings():
    code = ("from odc_pp.runtime.host_memory import keep_freed_host_memory as keep\n"
            "print(keep(), keep())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["True", "True"]
