"""Single-process checks of odc_pp.odc.primitives: shard_range closed form, config
validation, the host extension's conversions, and stale-segment cleanup."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from odc_pp import _C
from odc_pp.odc import primitives as odc
from odc_pp.odc.transport_host import (dtype_code, list_segments, remove_stale_segments,
                                       segment_name)


@given(st.integers(0, 10_000), st.integers(1, 17))
def test_shard_ranges_tile_the_tensor(numel, world_size):
    ranges = [odc.shard_range(numel, r, world_size) for r in range(world_size)]
    shard_size = -(-numel // world_size)
    assert ranges[0][0] == 0 and ranges[-1][1] == numel
    for (start, end), (next_start, _) in zip(ranges, ranges[1:]):
        assert end == next_start and 0 <= end - start <= shard_size


@pytest.mark.parametrize("kwargs", [{"backend": "nccl"}, {"timeout_s": 0}, {"num_threads": -1}])
def test_config_rejects_bad_values(kwargs):
    with pytest.raises(ValueError):
        odc.TransportConfig(**kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("threads", [1, 3])
def test_accumulate_local_converts_like_torch(dtype, threads):
    generator = torch.Generator().manual_seed(0)
    values = (torch.randn(3_000_001, generator=generator) * 1000).to(dtype)
    values[:4] = torch.tensor([float("inf"), -0.0, 6e-8, -65504.0]).to(dtype)
    target = torch.full((values.numel(),), 0.25)
    expected = target + values.float()
    _C.accumulate_local(target.data_ptr(), values.data_ptr(), dtype_code(dtype),
                        values.numel(), threads)
    assert torch.equal(target, expected)


STREAMING_MIN = _C.streaming_min_bytes()


@pytest.mark.parametrize("nbytes", [0, 1, 63, 64, 255, 4097, STREAMING_MIN - 1, STREAMING_MIN,
                                    STREAMING_MIN + 13, 2 * STREAMING_MIN + 4093])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kernel", ["transport", "streaming", "cached", "libc"])
def test_copy_kernels_copy_exactly_the_range(nbytes, threads, kernel):
    """Every size and (mis)alignment, both sides of the streaming threshold, and each kernel
    forced (a piece of a large / of a small transfer): the bytes are copied and the
    neighbours untouched."""
    generator = torch.Generator().manual_seed(nbytes)
    source = torch.randint(0, 255, (nbytes + 80,), dtype=torch.uint8, generator=generator)
    for dst_offset, src_offset in [(0, 0), (1, 3), (17, 64), (63, 5)]:
        target = torch.zeros(nbytes + 80, dtype=torch.uint8)
        dst, src = target.data_ptr() + dst_offset, source.data_ptr() + src_offset
        if kernel == "transport":
            _C.copy_bytes(dst, src, nbytes, threads)
        elif kernel in ("streaming", "cached"):
            transfer = 1 << 40 if kernel == "streaming" else 0
            _C.copy_bytes(dst, src, nbytes, threads, transfer_bytes=transfer)
        else:
            _C.libc_copy_bytes(dst, src, nbytes)
        assert torch.equal(target[dst_offset:dst_offset + nbytes],
                           source[src_offset:src_offset + nbytes])
        assert not target[:dst_offset].any() and not target[dst_offset + nbytes:].any()


def test_sse2_streaming_kernel_copies_exactly():
    """The fallback for CPUs without AVX-512, forced (it is chosen once per process)."""
    if _C.copy_kernel() == "memcpy":
        pytest.skip("no streaming kernel on this architecture")
    code = ("import torch; from odc_pp import _C\n"
            "assert _C.copy_kernel() == 'sse2 streaming stores', _C.copy_kernel()\n"
            "for n in (0, 1, 15, 16, 63, 64, 65, 4099, (4 << 20) + 7):\n"
            "    for off in (0, 1, 9):\n"
            "        s = torch.randint(0, 255, (n + 32,), dtype=torch.uint8)\n"
            "        d = torch.zeros(n + 32, dtype=torch.uint8)\n"
            "        _C.copy_bytes(d.data_ptr() + off, s.data_ptr() + 3, n, 2, transfer_bytes=1 << 40)\n"
            "        assert torch.equal(d[off:off + n], s[3:3 + n]), (n, off)\n"
            "        assert not d[:off].any() and not d[off + n:].any(), (n, off)\n")
    env = dict(os.environ, ODC_PP_STREAMING_ISA="sse2")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, timeout=120)
    assert result.returncode == 0, result.stderr


def test_copy_kernel_is_named_and_streams_from_the_threshold():
    assert _C.copy_kernel() in {"avx512 streaming stores", "sse2 streaming stores", "memcpy"}
    if _C.copy_kernel() != "memcpy":
        assert not _C.prefers_streaming(STREAMING_MIN - 1) and _C.prefers_streaming(STREAMING_MIN)


def test_streaming_threshold_from_the_environment():
    code = "from odc_pp import _C; print(_C.streaming_min_bytes())"
    good = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, ODC_PP_STREAMING_MIN_BYTES="12345"), timeout=60)
    assert good.returncode == 0 and good.stdout.strip() == "12345", good.stderr
    bad = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, ODC_PP_STREAMING_MIN_BYTES="8MiB"), timeout=60)
    assert bad.returncode != 0 and "ODC_PP_STREAMING_MIN_BYTES must be a byte count" in bad.stderr


def test_stale_segment_of_dead_pid_is_removed_and_live_one_kept():
    dead_pid = 2**22 + 12345  # above the default pid_max: never a live process
    assert not _C.pid_alive(dead_pid) and _C.pid_alive(os.getpid())
    dead = _C.Segment.create(segment_name(dead_pid, "unittest0000", "ctl"), 64)
    live = _C.Segment.create(segment_name(os.getpid(), "unittest0000", "ctl"), 64)
    try:
        removed = remove_stale_segments()
        assert dead.name.lstrip("/") in removed
        assert live.name.lstrip("/") in list_segments()
    finally:
        live.unlink()
        dead.unlink()
    assert live.name.lstrip("/") not in list_segments()
