"""Context parallelism's cost terms in the planner, in one place (issue 32).

With ``--context-parallel-size N`` (Megatron's meaning, docs/context_parallel.md) every
sequence of a microbatch is split into 2N chunks and CP rank ``i`` holds chunks ``i`` and
``2N - 1 - i`` (causal load balance); attention is a ring over the N ranks. Per rank:

* compute: :func:`compute_share` = 1/N of the cp=1 F, B and W executed FLOPs (causal
  attention at half the formula's; the linear layers
  see L/N tokens; the load-balanced chunks give every rank 1/N of the causal attention
  pairs), at the efficiency of an L/N-token microbatch;
* ring: per layer N steps; in each of the N-1 transfers a rank receives the K and V
  blocks of another rank, ``2 * rows * L/N * kv_width/tp * 2`` bytes (bf16) forward; the
  backward moves them again plus dK and dV (twice the bytes). Each transfer overlaps the
  attention of one block (1/N of the rank's attention FLOPs): a step takes
  ``max(block compute, transfer)``, so the exposed ring time per layer is
  ``(N-1) * max(0, transfer - block compute)`` (:func:`ring_seconds`, 0 at N = 1);
* link: NVLink when the tp x cp ranks of a ring share a node, else the inter-node link
  (:func:`ring_link`);
* memory: activations of a microbatch / N (each rank saves its L/N tokens,
  :func:`activation_share`); parameters, gradients and optimizer state are not divided
  by N, but ODC shards the gradient accumulators and optimizer state over dp x cp ranks
  (:func:`sharding_group`).
"""

from __future__ import annotations

import math

from .hardware import GB, Hardware
from .inputs import ModelSpec

__all__ = ["CP_SIZES", "compute_share", "activation_share", "sharding_group", "ring_link",
           "attention_flops", "ring_seconds", "cp_fits_length", "cp_worth_trying"]

CP_SIZES = (1, 2, 4, 8)
"""Context-parallel sizes the planner tries."""


def compute_share(cp: int) -> float:
    """Fraction of a microbatch's F/B/W FLOPs one CP rank computes: 1/cp."""
    return 1.0 / cp


def activation_share(cp: int) -> float:
    """Fraction of a microbatch's saved activations one CP rank holds: 1/cp."""
    return 1.0 / cp


def sharding_group(dp: int, cp: int) -> int:
    """Ranks ODC shards gradients and optimizer state over: dp x cp."""
    return dp * cp


def cp_fits_length(length: int, cp: int) -> bool:
    """The load-balanced split needs the sequence length divisible by 2 x cp."""
    return cp == 1 or length % (2 * cp) == 0


def ring_link(cluster: Hardware, *, tp: int, cp: int) -> float:
    """Bytes/s of the ring's link: NVLink when tp x cp ranks fit a node, else
    inter-node (the preset's NVLink when it has no inter-node figure)."""
    inside = tp * cp <= cluster.gpus_per_node or cluster.internode_gbps is None
    gbps = cluster.tp_link_gbps if inside else cluster.internode_gbps
    return (gbps or math.inf) * GB  # unknown (a measured machine): not costed


def attention_flops(model: ModelSpec, rows: int, length: int) -> tuple[float, float]:
    """(forward, backward) FLOPs one layer's causal attention executes (the part of
    :meth:`ModelSpec.executed_layer_flops` quadratic in the length: f(L) = a L + b L^2
    solved from L = 1, 2; the masked half skipped, as the pass times count it) for
    ``rows`` rows of ``length`` tokens."""
    out = []
    for k in (0, 1):
        one, two = model.executed_layer_flops(1, 1)[k], model.executed_layer_flops(1, 2)[k]
        out.append(rows * (two - 2 * one) / 2 * length * length)
    return out[0], out[1]


def ring_seconds(model: ModelSpec, *, rows: int, length: int, cp: int, tp: int,
                 link_bytes_per_s: float, flops_per_s: float) -> tuple[float, float]:
    """(forward, backward) exposed ring seconds of one layer on one rank (module
    docstring): ``(cp-1) * max(0, transfer - block compute)`` with a forward transfer of
    ``2 * rows * L/cp * kv_width/tp * 2`` bytes and twice that backward; block compute =
    the rank's attention FLOPs / cp over ``flops_per_s`` (one tp rank's achieved speed)."""
    if cp == 1:
        return 0.0, 0.0
    kv_bytes = 2 * rows * (length / cp) * model.kv_width / tp * 2
    fwd, bwd = attention_flops(model, rows, length)
    out = []
    for transfer, flops in ((kv_bytes, fwd), (2 * kv_bytes, bwd)):
        block = flops / tp / cp / cp / flops_per_s
        out.append((cp - 1) * max(0.0, transfer / link_bytes_per_s - block))
    return out[0], out[1]


def cp_worth_trying(model: ModelSpec, *, tp: int, memory_bytes: float,
                    layer_bytes: float) -> bool:
    """Whether cp > 1 is searched at tensor-parallel size ``tp``: the longest sample's
    activations at cp = 1 (``layer_bytes`` per layer with --recompute-lgd; 1F1B's first
    rank holds every layer's, whatever pp) take more than half of the memory. Otherwise
    cp = 1 fits with headroom and CP only adds ring traffic (the search stays bounded)."""
    return model.num_layers * layer_bytes > 0.5 * memory_bytes
