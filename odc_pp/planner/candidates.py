"""The configurations the planner evaluates: every tp x cp x pp x dp layout of the job
with its schedule and data variants, and which of them Megatron-LM itself runs."""

from __future__ import annotations

import itertools
from dataclasses import replace

from . import context_parallel as cpm
from odc_pp.layout import DataParallelMode

from .chunks import primary_layouts
from .config import MEGATRON_SCHEDULES, Candidate, PlanConfig
from .memory import Workload, layer_activation_bytes

__all__ = ["candidates", "megatron_default", "MEGATRON_SOURCE", "MICRO_BATCHES"]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _cp_sizes(config: PlanConfig, tp: int) -> tuple[list[int], list[int]]:
    """Context-parallel sizes searched at ``tp``: ``(ours, megatron)``. Ours: 1, and when
    the longest sample's activations crowd memory at cp = 1
    (:func:`~odc_pp.planner.context_parallel.cp_worth_trying`) the smallest cp > 1 that
    relieves them (dividing the GPUs and the sequence length / 2; a larger cp only adds
    ring traffic, which keeps the search bounded). Megatron's default layouts (few per
    size) are tried at every such cp, so its baseline is the best Megatron-LM offers."""
    model = config.model
    layer = layer_activation_bytes(Workload(model=model, seq_length=model.seq_length),
                                   recompute=True, tp=tp, sequence_parallel=tp > 1)
    usable = [cp for cp in cpm.CP_SIZES[1:] if config.gpus % (tp * cp) == 0 and
              cpm.cp_fits_length(model.seq_length, cp)]
    relieving = [cp for cp in usable if not cpm.cp_worth_trying(
        model, tp=tp, memory_bytes=config.memory_bytes, layer_bytes=layer / cp)]
    if not usable or not cpm.cp_worth_trying(model, tp=tp, memory_bytes=config.memory_bytes,
                                             layer_bytes=layer):
        return [1], [1]
    return [1, relieving[0] if relieving else usable[-1]], [1, *usable]


MICRO_BATCHES = (1, 2, 4)
"""--micro-batch-size values tried for the Megatron-default candidates' unpacked rows
(Megatron pads every row to the microbatch's longest)."""


def candidates(config: PlanConfig) -> list[Candidate]:
    """Every candidate the search evaluates, in a fixed order."""
    model, out = config.model, []
    caps = [config.model.seq_length * k for k in config.token_caps]
    for tp in config.tp_sizes:
        if config.gpus % tp or tp > config.cluster.gpus_per_node or \
                model.num_attention_heads % tp:
            continue
        ours, megatron = _cp_sizes(config, tp)
        for cp in megatron:
            for pp in _divisors(config.gpus // (tp * cp)):
                dp = config.gpus // (tp * cp * pp)
                if config.global_batch < dp:
                    continue
                layouts = _layouts(config, tp, cp, pp, dp, caps)
                out += layouts if cp in ours else [c for c in layouts if megatron_default(c)]
    return out


def _layouts(config: PlanConfig, tp: int, cp: int, pp: int, dp: int,
             caps: list[int]) -> list[Candidate]:
    """The schedule, chunk-count (:func:`~.chunks.primary_layouts`: equal stages, or
    the embedding and loss accounted in the split or lighter ends where the layers do not
    split evenly) and data variants of one
    tp x cp x pp x dp layout (cp > 1: the smallest packed cap only, to keep the search
    bounded)."""
    out = []
    for name in config.schedules:
        if pp == 1 and name != "1f1b":
            continue  # every schedule is the same single stage
        for (chunks, uneven, accounted), (dp_mode, balance, cap, searched) in itertools.product(
                primary_layouts(name, config.model.num_layers, pp),
                list(_data_modes(config, dp, caps[:1] if cp > 1 else caps))):
            base = Candidate(tp=tp, cp=cp, pp=pp, dp=dp, schedule=name, dp_mode=dp_mode,
                             balance=balance, packed=cap is not None, token_cap=cap,
                             chunks=chunks, uneven=uneven, accounted=accounted)
            if not searched and not megatron_default(base):
                continue  # added for row M only
            out.append(base)
            if megatron_default(base) and not base.packed:
                out += [replace(base, micro_batch=m) for m in MICRO_BATCHES[1:]
                        if config.global_batch % (dp * m) == 0 and
                        config.global_batch // (dp * m) >= pp]
    return out


def _data_modes(config: PlanConfig, dp: int, caps: list[int]):
    """(dp mode, load balance, packed cap or None, searched) of one layout. One replica
    needs one dp mode (it does not matter), the first. ``ddp`` with ``none`` (unpacked,
    or packed under every cap: Megatron's own data path) is always tried for the
    Megatron default; ``searched`` is False for those added only for it."""
    first, ddp = config.dp_modes[0], DataParallelMode.DDP
    modes = [mode for mode in config.dp_modes if dp > 1 or mode is first]
    for dp_mode in modes + ([] if ddp in modes else [ddp]):
        searched = dp_mode in modes
        if config.global_batch % dp == 0:
            yield dp_mode, "none", None, searched
            if dp > 1 and searched:
                yield dp_mode, "balanced", None, searched
        if dp_mode.is_ddp:
            for cap in caps:
                yield dp_mode, "none", cap, searched
        if dp_mode.is_odc:
            for cap in caps:
                yield dp_mode, "lb-mini", cap, searched


MEGATRON_SOURCE = ("Megatron-LM as its users run it: --dp-mode ddp (DDP with the distributed "
                   "optimizer), 1F1B/interleaved, tp/cp/pp/dp, packed rows under a token "
                   "cap (as Megatron-Bridge packs SFT data) or unpacked rows at "
                   "--micro-batch-size 1/2/4 (padded to the longest), --recompute-lgd when "
                   "needed; fastest that fits")
"""What the Megatron-default row (M) is, as printed under the plan."""


def megatron_default(cand: Candidate) -> bool:
    """Megatron's default: 1F1B or interleaved, ``ddp`` (Megatron's DDP with the
    distributed optimizer), no load balancing (``none``), packed or unpacked rows (any tp,
    cp, pp, dp, micro-batch size and token cap)."""
    return cand.schedule in MEGATRON_SCHEDULES and cand.dp_mode.is_ddp and \
        cand.balance == "none"
