"""Optimizer mathematics shared by the runtime and the sharded AdamW
(:mod:`odc_pp.odc.sharded_optimizer`): the global gradient norm, the non-finite check and
clipping (:mod:`odc_pp.optim.clip`), fp16 loss scaling (:mod:`odc_pp.optim.loss_scale`),
per-group learning rates (:mod:`odc_pp.optim.rates`), and the optimizer step the runtime
takes when a minibatch's gradients are final (:mod:`odc_pp.optim.step`): synchronous, or
post-validated (:mod:`odc_pp.optim.post_validation`: step eagerly, validate while the
next minibatch runs). A bottom layer: it imports torch only."""

__all__ = ["clip", "loss_scale"]

from . import clip, loss_scale
