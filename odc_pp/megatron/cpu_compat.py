"""Run megatron-core's ``GPTModel`` on CPU (gloo) without forking or patching it.

megatron-core 0.16 hard-codes CUDA in three places that a CPU run reaches. Each is
avoided through a public extension point instead of a patch:

1. ``DotProductAttention`` takes its score buffer from ``parallel_state``'s global memory
   buffer, which allocates on ``torch.cuda.current_device()``. Our layer spec
   (:mod:`odc_pp.megatron.layers`) plugs in :class:`HostDotProductAttention`, a subclass
   that allocates its buffer on the query's device.
2. The CUDA RNG tracker's ``fork()`` swaps CUDA generator states. On CPU we install
   megatron's own no-op-fork tracker (``initialize_rng_tracker(inference_rng_tracker=
   True)``): dropout then draws from the default (CPU) generator. Only done when
   ``device`` is CPU; the GPU path keeps megatron's normal tracker.
3. The causal mask defaults to ``get_default_causal_mask``, built on "cuda". The runtime
   always passes an explicit boolean mask (:func:`causal_mask`) built on the activation's
   device, so the default is never reached.

Rotary embeddings also move ``inv_freq`` to CUDA, so CPU models use learned absolute
position embeddings. ``parallel_state`` is never initialised: every module receives an
explicit :class:`ProcessGroupCollection` (see :func:`singleton_process_groups`), so the
runtime's pipeline layout is invisible to megatron (each chunk is a 1-stage model).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["prepare_megatron_for_device", "singleton_process_groups", "causal_mask"]


def prepare_megatron_for_device(device: torch.device | str, *, seed: int = 1234) -> None:
    """Install the RNG tracker megatron-core needs on ``device`` (idempotent).

    CPU: megatron's no-op-fork tracker. GPU: megatron's CUDA tracker with its
    model-parallel state seeded from ``seed`` if none was added yet (TP=1, so the usual
    per-TP-rank offset does not apply).
    """
    from megatron.core.tensor_parallel import random as megatron_random

    device = torch.device(device)
    if device.type == "cpu":
        megatron_random.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
        return
    tracker = megatron_random.get_cuda_rng_tracker()
    name = megatron_random._MODEL_PARALLEL_RNG_TRACKER_NAME
    if name not in tracker.get_states():
        tracker.add(name, seed)


def singleton_process_groups():
    """A ProcessGroupCollection whose groups hold only this process (TP=CP=1).

    ``torch.distributed`` must be initialised. Collective over the default group: every
    process calls ``new_group`` for every rank, as ``torch.distributed`` requires.
    """
    from megatron.core.process_groups_config import ProcessGroupCollection

    if not dist.is_initialized():
        raise ValueError("initialise torch.distributed (e.g. gloo) before building the model")
    own_group = None
    for rank in range(dist.get_world_size()):
        group = dist.new_group([rank])
        if rank == dist.get_rank():
            own_group = group
    return ProcessGroupCollection(tp=own_group, pp=own_group, cp=own_group, embd=own_group,
                                  pos_embd=own_group, mp=own_group, tp_cp=own_group,
                                  dp=own_group, dp_cp=own_group)


def causal_mask(seq_len: int, device: torch.device | str) -> torch.Tensor:
    """Megatron's boolean mask convention: True marks positions that may NOT attend."""
    return torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool, device=device),
                      diagonal=1)[None, None]
