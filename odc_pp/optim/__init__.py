"""Optimizer mathematics shared by the runtime and the sharded AdamW
(:mod:`odc_pp.odc.sharded_optimizer`): the global gradient norm, the non-finite check and
clipping (:mod:`odc_pp.optim.clip`), fp16 loss scaling (:mod:`odc_pp.optim.loss_scale`),
per-group learning rates (:mod:`odc_pp.optim.rates`), and the optimizer step the runtime
takes when a minibatch's gradients are final (:mod:`odc_pp.optim.step`): synchronous, or
post-validated (:mod:`odc_pp.optim.post_validation`: step eagerly, validate while the
next minibatch runs). A bottom layer: it imports torch only."""

import importlib

__all__ = ["clip", "loss_scale"]


def __getattr__(name: str):
    # lazy (PEP 562): pretrain_gpt.py's flag checks import loss_scale and rates before torch
    if name in __all__:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
