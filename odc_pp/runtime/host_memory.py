"""Host memory on CPU runs: keep freed memory in the process.

glibc's malloc returns a freed block above its mmap threshold to the kernel at once, and
trims the heap's free top above its trim threshold; the next allocation of that size
then page-faults on every page it touches again. A pipeline step frees and re-allocates
activation-sized blocks all the time, and the deferred weight gradients of the
zero-bubble schedules hold more of them across actions, so more of each B lands on fresh
pages. Measured on this 2-core machine (one thread, a 2-layer chunk at hidden 256 and
sequence 1024, B then W of 4 microbatches, ms per microbatch): B 248 -> 184 with
:func:`keep_freed_host_memory`, B + W 297 -> 227, against 244 -> 222 for torch's native
linear backward (malloc settings given as environment variables, the same values). In
``benchmarks/bench_runtime.py`` (pp=2, seq 1024; one run each, load 1.0-1.6) the step
went from 4.22 to 3.41 s for ZB-V, 3.88 to 3.47 s for interleaved, and 3.78 to 3.20 s and
4.31 to 3.85 s for torch.distributed.pipelining's ZBVZeroBubble and
InterleavedZeroBubble: one setting of the process, for every schedule in it. GPU memory
is unaffected (torch's caching allocator keeps device blocks).
"""

from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["keep_freed_host_memory"]

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -2, -3, -4
"""glibc's mallopt parameters (malloc.h)."""


def keep_freed_host_memory(*, mmap_threshold: int = 32 * 2 ** 20,
                           trim_threshold: int = -1,
                           top_pad: int = 2 ** 30, mmap_max: int = 0) -> bool:
    """Serve blocks up to ``mmap_threshold`` bytes (glibc's largest) from the heap, trim
    its free top only beyond ``trim_threshold`` and grow it by ``top_pad`` extra (address
    space; pages count only once touched). ``trim_threshold`` -1 is glibc's ``SIZE_MAX``:
    never trim. The largest positive value ``mallopt`` takes (2 GiB - 1) is not enough: at
    seq 2048 in ``benchmarks/bench_runtime.py`` rank 0's heap is 4.5 GiB, a step's end
    frees a top above 2 GiB, glibc gives it back, and the next step faults it in again
    (30,000-180,000 minor faults in such a step). ``mmap_max`` (glibc's ``M_MMAP_MAX``):
    at most this many blocks mapped on their own at once; 0 serves the blocks above the
    threshold (glibc's ceiling is 32 MiB) from the heap too, so an attention score
    tensor of 64 MiB is reused after it is freed instead of mapped afresh. Process-wide;
    call before the big allocations. False where the C library has no ``mallopt`` (not
    glibc): nothing changed."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all(mallopt(param, value) == 1 for param, value in (
        (M_MMAP_THRESHOLD, mmap_threshold), (M_TRIM_THRESHOLD, trim_threshold),
        (M_TOP_PAD, top_pad), (M_MMAP_MAX, mmap_max)))
