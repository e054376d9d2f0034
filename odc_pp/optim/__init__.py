"""Optimizer mathematics shared by the runtime's post-validation and the sharded AdamW
(:mod:`odc_pp.odc.sharded_optimizer`): the global gradient norm, the non-finite check and
clipping (:mod:`odc_pp.optim.clip`), and fp16 loss scaling
(:mod:`odc_pp.optim.loss_scale`). A bottom layer: it imports torch only."""

__all__ = ["clip", "loss_scale"]

from . import clip, loss_scale
