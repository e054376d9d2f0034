"""CUDA-event timing for the GPU tests (printed, never asserted)."""

import torch


def median_fwd_bwd_ms(fn, args: tuple, grad: torch.Tensor, repeats: int = 20) -> float:
    """Median CUDA-event milliseconds of ``fn(*args).backward(grad)``, the first argument
    a leaf that requires grad."""
    leaf = args[0].detach().clone().requires_grad_()
    rest = args[1:]
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(leaf, *rest).backward(grad)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]
