"""Full activation recompute (Megatron's ``--recompute-granularity full``) composed with
the B/W split.

Which layers (:func:`recompute_groups`, per pipeline chunk, as Megatron's
``TransformerBlock._checkpointed_forward``): ``uniform`` -- every layer of the chunk, in
consecutive groups of ``recompute_num_layers``, each group keeping only its input;
``block`` -- only the first ``recompute_num_layers`` layers, each on its own; the other
layers save their activations as usual.

How (:class:`_RecomputedGroup`). F runs the group under ``no_grad`` and saves only its
input (a ``save_for_backward`` tensor, so the runtime's saved-tensor store accounts,
offloads and reloads it) plus the RNG states of the host and the device generator and
megatron's RNG tracker, and the keyed-dropout scope (:mod:`odc_pp.megatron.dropout`: the
microbatch's token ids). B restores those states, re-runs the group's forward with
autograd on, puts the caller's states back, and back-propagates the output gradient
through the recomputed graph: input gradients flow on, norm/bias gradients accumulate,
and the deferrable linears -- B runs inside the runtime's
``WeightGradQueue.deferring`` -- enqueue their weight-gradient GEMMs with the inputs and
output gradients B just recomputed. Those stay held until W, and the queue counts them
(``held_bytes``; the runtime's store adds them to the resident activations from B to W),
so the activation accounting sees what W keeps. Dropout masks are recomputed identically
from the restored scope's keys, so gradients equal those of the non-recomputed split backward.
The recompute adds one forward of the group to B: T_B grows by T_F of the recomputed
layers (:func:`odc_pp.schedule.costs.with_full_recompute`).
"""

from __future__ import annotations

import torch

from .dropout import current_scope, restored_scope

__all__ = ["recompute_groups", "apply_full_recompute", "RECOMPUTE_METHODS"]

RECOMPUTE_METHODS = ("uniform", "block")


def recompute_groups(num_layers: int, method: str, recompute_num_layers: int) -> list[range]:
    """Local layer ranges recomputed as one unit each (module docstring)."""
    if method not in RECOMPUTE_METHODS:
        raise ValueError(f"--recompute-method must be one of {RECOMPUTE_METHODS}, "
                         f"got {method!r}")
    if recompute_num_layers < 1:
        raise ValueError(f"--recompute-num-layers must be >= 1, got {recompute_num_layers}")
    if method == "uniform":
        return [range(start, min(start + recompute_num_layers, num_layers))
                for start in range(0, num_layers, recompute_num_layers)]
    return [range(layer, layer + 1) for layer in range(min(recompute_num_layers, num_layers))]


def _rng_states(device: torch.device):
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    device_state = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    tracker = get_cuda_rng_tracker()
    # CPU: megatron's inference tracker forks nothing and has no states to keep
    states = tracker.get_states() if hasattr(tracker, "get_states") else None
    return torch.get_rng_state(), device_state, states


def _set_rng_states(states, device: torch.device) -> None:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    host, device_state, tracker = states
    torch.set_rng_state(host)
    if device_state is not None:
        torch.cuda.set_rng_state(device_state, device)
    if tracker is not None:
        get_cuda_rng_tracker().set_states(tracker)


class _RecomputedGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run, kwargs, hidden):
        ctx.run, ctx.kwargs = run, kwargs
        ctx.rng = _rng_states(hidden.device)
        ctx.dropout = current_scope()
        with torch.no_grad():
            output = run(hidden, kwargs)
        ctx.save_for_backward(hidden)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        (hidden,) = ctx.saved_tensors
        hidden = hidden.detach().requires_grad_(True)
        current = _rng_states(hidden.device)
        _set_rng_states(ctx.rng, hidden.device)
        try:
            with torch.enable_grad(), restored_scope(ctx.dropout):
                output = ctx.run(hidden, ctx.kwargs)
        finally:
            _set_rng_states(current, hidden.device)
        torch.autograd.backward(output, grad_output)
        return None, None, hidden.grad


def apply_full_recompute(decoder, method: str, recompute_num_layers: int) -> list[range]:
    """Recompute ``decoder``'s (a megatron ``TransformerBlock``) layer groups: the first
    layer of each group runs the whole group inside :class:`_RecomputedGroup`, the
    group's other layers pass their input through. Returns the groups."""
    layers = list(decoder.layers)
    groups = recompute_groups(len(layers), method, recompute_num_layers)
    for group in groups:
        members = [layers[index] for index in group]
        originals = [layer.forward for layer in members]

        def run(hidden, kwargs, originals=originals):
            for forward in originals:
                hidden, _ = forward(hidden_states=hidden, **kwargs)  # no cross attention
            return hidden

        def first(*args, run=run, **kwargs):
            if args:
                raise ValueError("full recompute: a transformer layer was called with "
                                 "positional arguments; megatron's TransformerBlock passes "
                                 "keywords")
            hidden = kwargs.pop("hidden_states")
            if not torch.is_grad_enabled():  # evaluation: nothing to recompute
                return run(hidden, kwargs), kwargs.get("context")
            return _RecomputedGroup.apply(run, kwargs, hidden), kwargs.get("context")

        def passthrough(*args, **kwargs):
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            return hidden, kwargs.get("context")

        members[0].forward = first
        for layer in members[1:]:
            layer.forward = passthrough
    return groups
