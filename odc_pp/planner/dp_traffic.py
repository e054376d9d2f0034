"""Exposed data-parallel traffic of a candidate per step, by ``--dp-mode``.

* ``collective`` (FSDP-style, odc-pp's collective mode): an all-reduce's worth,
  ``2 (g-1)/g`` of the stage's bf16 gradients, not overlapped.
* ``odc`` / ``hierarchical``: a reduce-scatter's worth, ``(g-1)/g`` of them.
* ``ddp`` (Megatron's DDP with the distributed optimizer, ``odc_pp.odc.ddp``): the fp32
  ``main_grad`` is reduce-scattered once per minibatch, overlapped with the last
  microbatch's backward (only what exceeds it is exposed), then the updated bf16
  parameters are all-gathered after the optimizer step (exposed: odc-pp's ddp does not
  overlap it with the next forward).

``g`` is the sharding group, dp x cp (gradients are summed over it).
"""

from __future__ import annotations

import math

from . import context_parallel as cpm
from .config import GB, Candidate, PlanConfig

__all__ = ["dp_comm_seconds", "link_bytes", "DDP_GRAD_BYTES", "PARAM_BYTES"]

DDP_GRAD_BYTES = 4
"""Bytes per gradient element ``ddp`` reduce-scatters (fp32 ``main_grad``, its default)."""
PARAM_BYTES = 2
"""Bytes per parameter element all-gathered, and per gradient element of the other modes
(bf16)."""


def link_bytes(config: PlanConfig, inside: bool) -> float:
    """Bytes/s inside a node (NVLink) or between nodes; unknown: not costed."""
    cluster = config.cluster
    gbps = cluster.tp_link_gbps if inside else cluster.internode_gbps
    return (gbps or math.inf) * GB


def dp_comm_seconds(config: PlanConfig, cand: Candidate, overlap_s: float = 0.0) -> float:
    """Seconds of a step's data-parallel traffic that no compute hides. ``overlap_s``
    (``ddp`` only): the backward of the last microbatch on the busiest rank, which the
    gradient reduce-scatter overlaps."""
    group = cpm.sharding_group(cand.dp, cand.cp)
    if group == 1:
        return 0.0
    elements = config.model.params() / (cand.tp * cand.pp)  # per rank
    inside = cand.tp * cand.pp * group <= config.cluster.gpus_per_node
    moved = (group - 1) / group * elements / link_bytes(config, inside)  # s per byte/element
    if cand.dp_mode.is_ddp:
        reduce_scatter = moved * DDP_GRAD_BYTES
        return max(0.0, reduce_scatter - overlap_s) + moved * PARAM_BYTES
    share = moved * PARAM_BYTES
    return 2 * share if cand.dp_mode.is_collective else share
