"""The optimizer step of one iteration, built once from the flags: synchronous, or
overlapped with --enable-optimizer-post-validation. The runtime takes it when the
minibatch's gradients are final (:mod:`odc_pp.optim.step`); the training step does not
branch on which one it is.

Both paths take the global gradient norm and the clipping from :mod:`odc_pp.optim.clip`
through the sharded AdamW, whose norm group holds every rank that owns a disjoint piece
of the model's gradient: all pp x dp ranks, or with hierarchical data parallelism one
host's ranks of every stage (one copy of the model). One all-reduce, so with
post-validation it runs entirely in the background.

Synchronous: ``ShardedAdamW.clip_and_step`` -- reduce, then skip (inf/nan anywhere: every
rank drops the step's gradients and keeps its weights) or clip and step; --fp16 unscales
the gradients first and updates the loss scale with the global outcome (megatron-core's
order). Post-validation (:mod:`odc_pp.optim.post_validation`): start the reduction,
snapshot the owned master weights, AdamW moments and gradients, step and publish at once;
the next minibatch runs on the new weights while the reduction completes, and at its
POST_VALIDATION the check either keeps the step or rolls back (skip) / rolls back, clips
with the global norm and steps again -- then that minibatch runs again on the corrected
weights. Both compute the same numbers, so losses are identical.
"""

from __future__ import annotations

from odc_pp.optim.clip import scale_
from odc_pp.optim.loss_scale import LossScaler
from odc_pp.optim.post_validation import PostValidatedOptimizer, PostValidationConfig
from odc_pp.optim.step import OptimizerStep, StepOutcome, SynchronousStep

from .arg_sections import OptimizerArgs

__all__ = ["build_optimizer_step"]


def build_optimizer_step(optimizer, optimizer_args: OptimizerArgs, *, post_validation: bool,
                         loss_scaler: LossScaler | None, timeout_s: float,
                         device) -> OptimizerStep:
    """The step of ``optimizer`` (a ShardedAdamW) the flags ask for; --clip-grad 0: no
    clip. --fp16 (``loss_scaler``) does not compose with post-validation (refused at
    parse time)."""
    clip_grad = optimizer_args.clip_grad
    if post_validation:
        config = PostValidationConfig(max_grad_norm=clip_grad or None, timeout_s=timeout_s)
        return PostValidatedOptimizer(config, optimizer=optimizer,
                                      group=optimizer.norm_groups, device=device)

    def step(lr: float | None) -> StepOutcome:
        if loss_scaler is not None:
            scale_(optimizer.engine.owned_grads(), loss_scaler.inv_scale)
        outcome = optimizer.clip_and_step(clip_grad, lr=lr)
        if loss_scaler is not None:
            loss_scaler.update(outcome.action == "skipped")
        return outcome
    return SynchronousStep(step)
