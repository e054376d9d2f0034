"""The optimizer step with --enable-optimizer-post-validation, and the test-only
inf injection of --inject-nonfinite-grad-iter.

Post-validation (odc_pp.runtime.post_validation) around the sharded AdamW: after the
pipeline's last action this rank starts the reduction of its (squared owned-gradient
norm, inf flag) over the data-parallel shard group and then the pipeline group (each
rank owns a disjoint piece of the model's gradient, so the sum over all pp x dp ranks is
the global norm; with hierarchical data parallelism the shard group is one host's ranks,
one copy of the model), snapshots its owned master weights and AdamW moments and steps
at once; the validation then rolls back (inf/nan anywhere: the step is skipped on every
rank) or rolls back, clips with the global norm and steps again, and only then publishes
the new shards (``engine.finish_step``). It computes the same numbers as the synchronous
path (same reduction order, same clipping coefficient), so losses are identical.
"""

from __future__ import annotations

import math

from odc_pp.runtime.post_validation import PostValidatedOptimizer, PostValidationConfig

__all__ = ["build_post_validator", "post_validated_step", "inject_nonfinite_grad"]


def build_post_validator(parts, args, topo) -> PostValidatedOptimizer:
    """The post-validating wrapper of ``parts.optimizer`` (``--clip-grad 0``: no clip)."""
    groups = [parts.norm_group] + ([topo.pp_group] if topo.pp > 1 else [])
    config = PostValidationConfig(max_grad_norm=args.clip_grad or None,
                                  timeout_s=args.distributed_timeout_minutes * 60)
    return PostValidatedOptimizer(config, optimizer=parts.optimizer, group=groups,
                                  device=topo.device)


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
