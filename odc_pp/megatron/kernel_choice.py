"""The one owner of choosing an optional fused kernel (``--fused-swiglu``,
``--fused-rope``): a kernel module gives a check that runs its kernels once per device
against the eager formula (forward and backward), and the flag's ``auto``/``on``/``off``
reads the result. Any failure of the check (no Triton, no CUDA device, a compile error, a
wrong value) keeps the eager path; ``on`` turns it into one error naming the flag."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import torch

__all__ = ["KernelCheck", "compare", "use_kernel"]


class KernelCheck:
    """``problem(device)``: None when the Triton kernels of ``name`` run on ``device``
    and match the eager path (``check(device)`` decides, once per device), else why not."""

    def __init__(self, name: str, check: Callable[[torch.device], str | None]) -> None:
        self.name = name
        self._check = check
        self._problems: dict[tuple, str | None] = {}

    def problem(self, device: torch.device, shape=None) -> str | None:
        """Why the kernels cannot run on ``device`` (None: they run). ``shape``: the real
        shape the step will run (hashable; handed to the check, which then compiles the
        kernel of that shape and no other), checked once per device and shape."""
        if importlib.util.find_spec("triton") is None:
            return "Triton is not installed"
        if device.type != "cuda":
            return f"the Triton kernels need a CUDA device, not {device.type}"
        key = (str(device), shape)
        if key not in self._problems:
            try:
                self._problems[key] = self._check(device) if shape is None else \
                    self._check(device, shape)
            except Exception as exc:  # noqa: BLE001 - any failure keeps the eager path
                self._problems[key] = \
                    f"the fused {self.name} failed: {type(exc).__name__}: {exc}"[:300]
        return self._problems[key]


def use_kernel(flag: str, setting: str, device: str | torch.device,
               check: KernelCheck, shape=None) -> bool:
    """``flag`` (``auto``/``on``/``off``): whether the fused kernels run on ``device``;
    ``on`` where they cannot is a ValueError naming ``flag`` and why."""
    if setting == "off":
        return False
    problem = check.problem(torch.device(device), shape)
    if problem is not None and setting == "on":
        raise ValueError(f"{flag} on: {problem}")
    return problem is None


def compare(name: str, pairs, *, tol: float) -> str | None:
    """None when every (label, fused, eager) pair is allclose within ``tol``, else which
    differs and by how much."""
    for label, fused, eager in pairs:
        if not torch.allclose(fused, eager, rtol=tol, atol=tol):
            return (f"the fused {name}'s {label} differs from the eager one by "
                    f"{(fused - eager).abs().max().item():.3g}")
    return None
