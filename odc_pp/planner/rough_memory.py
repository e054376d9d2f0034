"""The planner's own memory estimate of a candidate (``odc-pp tune-offload`` and the
first ranking of ``odc-pp plan``; the printed plans take the dry run's instead,
``PlanConfig.rank_memory``): model state per pipeline rank, a microbatch-chunk's
activation bytes and the simulator's memory deltas, in microbatch-chunks."""

from __future__ import annotations

import numpy as np

from odc_pp.schedule.generators import family
from odc_pp.schedule.placement import rank_stages

from . import context_parallel as cpm
from .config import Candidate, PlanConfig
from .memory import Workload, layer_activation_bytes, planned_state_bytes
from .post_validation import post_validated
from .uneven import stage_layout

__all__ = ["chunk_activation_bytes", "memory_units", "static_bytes", "peak_bytes"]


def chunk_activation_bytes(config: PlanConfig, cand: Candidate, tokens: float) -> float:
    """Activation bytes one microbatch-chunk of ``tokens`` tokens keeps from F to B on a
    rank (:func:`~odc_pp.planner.memory.layer_activation_bytes` of its layers)."""
    model = config.model
    layers = max(stage_layout(config, cand).counts())  # the largest stage's (a bound)
    shape = Workload(model=model, seq_length=max(1, int(round(tokens))),
                     flash_attention=config.flash_attention)
    return layers * cpm.activation_share(cand.cp) * layer_activation_bytes(
        shape, recompute=cand.recompute, tp=cand.tp, sequence_parallel=cand.tp > 1)


def memory_units(config: PlanConfig, cand: Candidate) -> tuple[float, float, float]:
    """(mem_f, mem_b, mem_w) of the simulator, in microbatch-chunks: F saves one chunk's
    activations; with --keep-sp-input-for-w B also keeps W's two gathered inputs
    (``2 (1 - 1/tp) s h`` 16-bit values per layer) until W frees them with the rest."""
    if not cand.keep_sp_input_for_w:
        return (1.0, 0.0, -1.0)
    model, length = config.model, config.model.seq_length
    layers = max(stage_layout(config, cand).counts())
    kept = 2 * (1 - 1 / cand.tp) * length * model.hidden_size * 2 * layers \
        * cpm.activation_share(cand.cp) / chunk_activation_bytes(config, cand, length)
    return (1.0, kept, -1.0 - kept)


def static_bytes(config: PlanConfig, cand: Candidate) -> list[float]:
    """Model state of each pipeline rank (planner.memory's formulas): its chunks' layers,
    the embedding on the first stage and the output layer on the last (a tied one there
    too when they are apart: Megatron keeps two copies), each divided by tp; with
    post-validation (:func:`~.post_validation.post_validated`) its snapshot."""
    model, fam = config.model, family(cand.schedule)
    chunks = cand.num_chunks
    stages = cand.pp * chunks
    counts, table = stage_layout(config, cand).counts(), model.vocab_size * model.hidden_size

    def params(stage: int) -> float:
        output = stage == stages - 1 and (stages > 1 or not model.tied)
        return (counts[stage] * model.layer_params() + table * ((stage == 0) + output)) / cand.tp
    return [float(planned_state_bytes(
        [params(stage) for stage in rank_stages(fam.placement, cand.pp, chunks, rank)],
        dp=cpm.sharding_group(cand.dp, cand.cp), one_sided=not cand.dp_mode.is_collective,
        replicated=cand.dp_mode.is_ddp, post_validation=post_validated(config, cand)))
        for rank in range(cand.pp)]


def peak_bytes(config: PlanConfig, cand: Candidate, units: np.ndarray,
               biggest: int) -> list[float]:
    """Predicted peak bytes per pipeline rank: model state, activations (``units``
    microbatch chunks of the largest microbatch) and, on the rank holding the last stage,
    the fp32 logits."""
    # ``units`` counts what the simulator keeps on the device: an offloaded chunk leaves
    # when its OFFLOAD completes and returns when its RELOAD starts
    chunk = chunk_activation_bytes(config, cand, biggest)
    peaks = [static + u * chunk for static, u in zip(static_bytes(config, cand), units)]
    fam = family(cand.schedule)
    last = cand.pp * cand.num_chunks - 1  # the rank holding it (rank 0 in a V)
    holder = next(rank for rank in range(cand.pp) if last in rank_stages(
        fam.placement, cand.pp, cand.num_chunks, rank))
    peaks[holder] += biggest * config.model.vocab_size * 4 / cand.tp * \
        cpm.activation_share(cand.cp)
    return peaks
