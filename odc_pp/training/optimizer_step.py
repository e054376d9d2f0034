"""The optimizer step of one iteration -- synchronous, or with
--enable-optimizer-post-validation -- and the test-only inf injection of
--inject-nonfinite-grad-iter.

Both paths take the global gradient norm and the clipping from :mod:`odc_pp.runtime.clip`
through the sharded AdamW, whose norm groups are the data-parallel shard group and then
the pipeline group (each rank owns a disjoint piece of the model's gradient, so the sum
over all pp x dp ranks is the global norm; with hierarchical data parallelism the shard
group is one host's ranks, one copy of the model).

Synchronous: reduce, then skip (inf/nan anywhere: every rank drops the step's gradients
and keeps its weights) or clip and step. Post-validation
(:mod:`odc_pp.runtime.post_validation`): start the reduction, snapshot the owned master
weights and AdamW moments and step at once; the validation then rolls back (skip) or
rolls back, clips with the global norm and steps again, and only then publishes the new
shards (``finish_step``). Both compute the same numbers, so losses are identical.
"""

from __future__ import annotations

import math

from odc_pp.runtime import clip
from odc_pp.runtime.post_validation import PostValidatedOptimizer, PostValidationConfig

__all__ = ["norm_groups", "build_post_validator", "synchronous_step", "post_validated_step",
           "inject_nonfinite_grad"]


def norm_groups(topo, dp_group) -> list:
    """The process groups the global gradient norm is reduced over, in order: the
    data-parallel shard group ``dp_group``, then the pipeline group if pp > 1."""
    return [dp_group] + ([topo.pp_group] if topo.pp > 1 else [])


def build_post_validator(parts, args, topo) -> PostValidatedOptimizer:
    """The post-validating wrapper of ``parts.optimizer`` (``--clip-grad 0``: no clip)."""
    config = PostValidationConfig(max_grad_norm=args.optimizer.clip_grad or None,
                                  timeout_s=args.parallel.distributed_timeout_minutes * 60)
    return PostValidatedOptimizer(config, optimizer=parts.optimizer,
                                  group=parts.optimizer.norm_groups, device=topo.device)


def synchronous_step(parts, args) -> tuple[float, bool]:
    """Global check, then skip or clip (``--clip-grad``) and step; (global grad norm
    before clipping, step skipped)."""
    state = parts.optimizer.grad_state()
    if not state.finite:  # inf/nan gradient: drop this step's gradients, keep the weights
        parts.optimizer.finish_step()
        return state.norm, True
    if args.optimizer.clip_grad > 0:
        clip.clip_(parts.engine.owned_grads(), state, args.optimizer.clip_grad)
    parts.optimizer.step()
    return state.norm, False


def post_validated_step(parts) -> tuple[float, bool]:
    """Eager step, then validation; (global grad norm, step skipped)."""
    parts.post_validator.step()
    outcome = parts.post_validator.validate()
    return outcome.grad_norm, outcome.action == "skipped"


def inject_nonfinite_grad(parts) -> None:
    """Testing only: write inf into this rank's first non-empty owned gradient."""
    for grad in parts.engine.owned_grads():
        if grad.numel():
            grad.view(-1)[0] = math.inf
            return
    raise ValueError("--inject-nonfinite-grad-iter: the injecting rank owns no gradient "
                     "element (use a larger model)")
