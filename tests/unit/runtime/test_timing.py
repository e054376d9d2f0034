"""ActionClock: marks resolve to seconds since restart (host clock on CPU; CUDA events on
GPU, checked in the GPU variant)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from odc_pp.runtime.timing import ActionClock


@dataclass(frozen=True)
class _Span:
    name: str
    start: object
    end: object


def _spans(device):
    clock = ActionClock(torch.device(device))
    first = clock.mark()
    x = torch.randn(256, 256, device=device)
    for _ in range(20):
        x = x @ x / 256
    second = clock.mark()
    spans = clock.resolve([_Span("a", first, second), _Span("b", second, clock.mark())])
    return clock, spans


def test_cpu_marks_resolve_to_seconds_since_restart():
    clock, (a, b) = _spans("cpu")
    assert not clock.uses_events
    assert a.name == "a" and isinstance(a.start, float)
    assert 0.0 <= a.start <= a.end <= b.start <= b.end
    first, second = clock.mark(), clock.mark()
    assert clock.elapsed(first, second) >= 0.0
    clock.restart()
    later = clock.mark()
    assert clock.seconds(later) < b.end + 1.0  # measured from the new origin


@pytest.mark.gpu
def test_cuda_marks_are_events_covering_the_kernels():
    clock, (a, b) = _spans("cuda")
    assert clock.uses_events
    assert 0.0 <= a.start <= a.end <= b.start <= b.end
    assert a.end > a.start  # twenty matmuls queued between the marks
    begin = clock.mark()
    torch.randn(1024, 1024, device="cuda").matmul(torch.randn(1024, 1024, device="cuda"))
    assert clock.elapsed(begin, clock.mark()) > 0.0
