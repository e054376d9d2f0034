"""The optimizer step of one iteration -- synchronous, or overlapped with
--enable-optimizer-post-validation -- and the test-only inf injection of
--inject-nonfinite-grad-iter.

Both paths take the global gradient norm and the clipping from :mod:`odc_pp.optim.clip`
through the sharded AdamW, whose norm group holds every rank that owns a disjoint piece
of the model's gradient: all pp x dp ranks, or with hierarchical data parallelism one
host's ranks of every stage (one copy of the model). One all-reduce, so with
post-validation it runs entirely in the background.

Synchronous (after the minibatch): ``ShardedAdamW.clip_and_step`` -- reduce, then skip
(inf/nan anywhere: every rank drops the step's gradients and keeps its weights) or clip
and step. Post-validation (:mod:`odc_pp.optim.post_validation`, driven by the runtime
at the schedule's POST_VALIDATION action): start the reduction, snapshot the owned master
weights, AdamW moments and gradients, step and publish at once; the next minibatch runs
on the new weights while the reduction completes, and at its POST_VALIDATION the check
either keeps the step or rolls back (skip) / rolls back, clips with the global norm and
steps again -- then that minibatch runs again on the corrected weights. Both compute the
same numbers, so losses are identical.
"""

from __future__ import annotations

import math

import torch

from odc_pp.optim.post_validation import PostValidatedOptimizer, PostValidationConfig

__all__ = ["build_post_validator", "inject_nonfinite_grad", "NonfiniteInjection"]


def build_post_validator(optimizer, *, clip_grad: float, timeout_s: float, device,
                         injection=None) -> PostValidatedOptimizer:
    """The post-validating wrapper of ``optimizer`` (a ShardedAdamW; ``clip_grad`` 0: no
    clip); ``injection``: a :class:`NonfiniteInjection` around it (tests)."""
    config = PostValidationConfig(max_grad_norm=clip_grad or None, timeout_s=timeout_s)
    return PostValidatedOptimizer(config, optimizer=injection or optimizer,
                                  group=optimizer.norm_groups, device=device)


def inject_nonfinite_grad(engine) -> None:
    """Testing only: write inf into this rank's first non-empty owned gradient."""
    for grad in engine.owned_grads():
        if grad.numel():
            grad.view(-1)[0] = math.inf
            return
    raise ValueError("--inject-nonfinite-grad-iter: the injecting rank owns no gradient "
                     "element (use a larger model)")


class NonfiniteInjection:
    """Testing only (--inject-nonfinite-grad-iter with post-validation): a
    PostValidationTarget that forwards to ``optimizer`` (a ShardedAdamW) and, while
    :attr:`armed`, writes inf into the owned gradients before their norm is taken (the
    eager step's gradients, as the synchronous path injects before its check)."""

    def __init__(self, optimizer) -> None:
        self.optimizer = optimizer
        self.armed = False

    def local_grad_norm_sq(self) -> torch.Tensor:
        if self.armed:
            inject_nonfinite_grad(self.optimizer.engine)
        return self.optimizer.local_grad_norm_sq()

    def snapshot(self) -> object:
        return self.optimizer.snapshot()

    def step_eagerly(self, lr: float | None = None) -> None:
        self.optimizer.step_eagerly(lr)

    def restore(self, snapshot: object) -> None:
        self.optimizer.restore(snapshot)

    def redo_clipped(self, snapshot: object, coefficient: float,
                     lr: float | None = None) -> None:
        self.optimizer.redo_clipped(snapshot, coefficient, lr)

    def finish_step(self) -> None:
        self.optimizer.finish_step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)
