"""The ODC engine's settings from the flags: one place that training, the dry run and the
memory plan ask (``OdcConfig`` from ``ParallelArgs``; the memory budget that
``--odc-param-residency auto`` plans for)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from odc_pp.layout import DataParallelMode

from .arg_sections import ParallelArgs

if TYPE_CHECKING:
    from odc_pp.odc.engine import OdcConfig

__all__ = ["odc_config", "device_memory"]


def odc_config(parallel: ParallelArgs, mode: DataParallelMode, *, param_dtype: str,
               param_residency: str = "minibatch") -> OdcConfig:
    """The engine settings the flags give (the dry run and the plan ask the same);
    ``mode``: the job's data-parallel mode (``Topology.layout.mode``);
    ``param_residency``: --odc-param-residency resolved (plan_memory.param_residency)."""
    from odc_pp.odc.engine import OdcConfig

    bf16_grads = parallel.grad_reduce_in_bf16 and param_dtype == "bfloat16"
    return OdcConfig(mode=mode, unit_driver="pipeline", param_dtype=param_dtype,
                     main_grad_dtype="bfloat16" if bf16_grads else "float32",
                     param_residency=param_residency)


def device_memory(device: torch.device) -> int | None:
    """Bytes of the GPU's memory (the budget --odc-param-residency auto plans for); None
    on the CPU."""
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_properties(device).total_memory
