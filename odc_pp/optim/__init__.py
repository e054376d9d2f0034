"""Optimizer mathematics shared by the runtime's post-validation and the sharded AdamW
(:mod:`odc_pp.odc.sharded_optimizer`): the global gradient norm, the non-finite check and
clipping (:mod:`odc_pp.optim.clip`). A bottom layer: it imports torch only."""

__all__ = ["clip"]

from . import clip
