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


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_a_freed_block_above_the_mmap_ceiling_is_reused_without_page_faults():
    """A 64 MiB tensor (an attention score block at sequence 2048, 4 heads, fp32) is
    above glibc's largest mmap threshold (32 MiB): without ``M_MMAP_MAX`` 0 every such
    block is mapped afresh and touching it page-faults 16,384 times. With it, glibc's heap
    grows by a few such blocks before the aligned requests fit the freed ones (warm-up),
    then reuses them as a training step does."""
    code = ("import resource, torch\n"
            "from odc_pp.runtime.host_memory import keep_freed_host_memory\n"
            "assert keep_freed_host_memory()\n"
            "for _ in range(8): torch.empty(2 ** 24).fill_(1.0)\n"  # touched, freed
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
            "for _ in range(8): torch.empty(2 ** 24).fill_(2.0)\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)\n")
    faults = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                check=True).stdout.split()[-1])
    # without the setting: 8 x 16,384; with it, at most one block's pages again (seen once
    # on a loaded 2-core CI machine: the warm-up had not settled after 8 blocks)
    assert faults <= 16384, f"{faults} minor page faults re-touching freed 64 MiB blocks"


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_a_freed_heap_top_above_two_gib_is_not_trimmed():
    """A step that frees more than 2 GiB at the heap's top (the largest trim threshold
    ``mallopt`` takes as a positive int) must keep it, or the next step faults it in
    again. mallinfo2's ``arena`` (bytes of the heap) must not shrink; the blocks are never
    touched, so the test costs no memory."""
    code = ("import ctypes, torch\n"
            "from odc_pp.runtime.host_memory import keep_freed_host_memory\n"
            "class Info(ctypes.Structure):\n"
            "    _fields_ = [(n, ctypes.c_size_t) for n in 'arena ordblks smblks hblks "
            "hblkhd usmblks fsmblks uordblks fordblks keepcost'.split()]\n"
            "libc = ctypes.CDLL('libc.so.6')\n"
            "if not hasattr(libc, 'mallinfo2'): print('skip'); raise SystemExit\n"
            "libc.mallinfo2.restype = Info\n"
            "assert keep_freed_host_memory()\n"
            "blocks = [torch.empty(2 ** 26) for _ in range(12)]\n"  # 3 GiB at the top
            "grown = libc.mallinfo2().arena\n"
            "while blocks: blocks.pop()\n"  # freed from the top down, as a step ends
            "print(grown, libc.mallinfo2().arena)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    if out == ["skip"]:
        pytest.skip("glibc without mallinfo2")
    grown, after = (int(v) for v in out)
    assert after == grown, f"the heap shrank from {grown >> 20} to {after >> 20} MiB"
