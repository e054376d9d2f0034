"""The one table of floating-point dtype names (``"float32"``, ``"bfloat16"``,
``"float16"``) used by configs, flags and Hugging Face ``torch_dtype`` strings."""

from __future__ import annotations

import torch

__all__ = ["FLOAT_DTYPES", "float_dtype"]

FLOAT_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                                        "float16": torch.float16}
"""Name -> torch dtype of the parameter/activation dtypes odc-pp trains in."""


def float_dtype(name: str, *, what: str = "dtype") -> torch.dtype:
    """The torch dtype called ``name``; ValueError naming ``what`` otherwise."""
    if name not in FLOAT_DTYPES:
        raise ValueError(f"{what} must be one of {sorted(FLOAT_DTYPES)}, got {name!r}")
    return FLOAT_DTYPES[name]
