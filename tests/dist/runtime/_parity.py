"""Worker code shared by the runtime tests: tiny GPT, data, reference and pipeline runs."""

from __future__ import annotations

import json

import torch
import torch.distributed as dist

MODEL = dict(vocab_size=128, hidden_size=64, num_layers=8, num_attention_heads=4,
             max_sequence_length=32)
SEQ_LENGTHS = (8, 16, 24, 32, 12, 20, 28, 8)
STEPS = 3
LR = 1e-3
CLIP_NORM = 0.05  # small enough that every step of the tiny model clips


def make_microbatches(num_microbatches: int, seed: int = 7, *, batch: int = 2,
                      equal_lengths: bool = False):
    from odc_pp.data import Microbatch, row_token_ids

    generator = torch.Generator().manual_seed(seed)
    microbatches = []
    for index in range(num_microbatches):
        seq = 16 if equal_lengths else SEQ_LENGTHS[index % len(SEQ_LENGTHS)]
        tokens = torch.randint(0, MODEL["vocab_size"], (batch, seq), generator=generator)
        labels = torch.randint(0, MODEL["vocab_size"], (batch, seq), generator=generator)
        loss_mask = (torch.rand(batch, seq, generator=generator) > 0.1).float()
        microbatches.append(Microbatch(  # global_token_ids: the keys of the dropout masks
            tokens=tokens, labels=labels, loss_mask=loss_mask,
            global_token_ids=row_token_ids(batch, seq, first_sample=index * batch)))
    return microbatches


def model_config(**changes):
    from odc_pp.megatron.model import ModelConfig

    return ModelConfig(**{**MODEL, **changes})


def reference_run(config, microbatches, groups, *, steps=STEPS, max_grad_norm=None):
    """Single-process training: same model, same data, plain autograd."""
    from odc_pp.megatron.model import build_chunks
    from odc_pp.data import count_tokens

    (model,) = build_chunks(config, pp_rank=0, pp_size=1, process_groups=groups)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    tokens = count_tokens(microbatches)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for mb in microbatches:
            token_losses = model(None, mb) * mb.loss_mask
            (token_losses.sum() / tokens).backward()
            total += float(token_losses.detach().sum())
        losses.append(total / tokens)
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
    return losses, {name: p.detach().clone() for name, p in model.global_named_parameters()}


_PIPEOFFLOAD = {"po-h": (1, [0]), "po-f": (1, None), "gis-h": (None, [0])}
"""``offload+<option>``: (group size, None: ceil(pp/2); offloaded chunks, None: all)."""


def build_schedule(name: str, pp: int, num_microbatches: int):
    """A lowered schedule by name; hand-* names come from tests/dist/runtime/_schedules.py."""
    from tests.dist.runtime import _schedules

    from odc_pp.schedule.costs import CostModel
    from odc_pp.schedule.generators import generate
    from odc_pp.schedule.lowering import lower, lower_communication

    if name == "hand-1f1b":
        return lower_communication(_schedules.one_f_one_b(pp, num_microbatches))
    if name == "hand-zb":
        return lower_communication(_schedules.one_f_one_b(pp, num_microbatches, split=True))
    if name == "hand-v":
        return lower_communication(_schedules.gpipe_v(pp, num_microbatches))

    base, _, option = name.partition("+")
    costs = CostModel(offload_bandwidth=1.0)
    if option in _PIPEOFFLOAD:  # PipeOffload's PO-H, PO-F (g = 1) and GIS-H (g = pp/2)
        from odc_pp.schedule.build import ScheduleRequest, build

        group, chunks = _PIPEOFFLOAD[option]
        schedule = build(ScheduleRequest.of(
            base, pp=pp, num_microbatches=num_microbatches, offload_chunks=chunks,
            group_size=group or (pp + 1) // 2, selective_offload=True), costs)
        assert any(a.kind.value == "OFFLOAD" for a in schedule.actions()), name
        return schedule
    if option == "fill":  # gaps filled under unequal (CPU seq-2048-like) costs, one rank
        # 5% slower (the first at pp=2, the last at pp=4: both leave gaps a W fills)
        t_f = [1.05 if rank == (0 if pp == 2 else pp - 1) else 1.0 for rank in range(pp)]
        costs = CostModel(t_f=t_f, t_b=[1.7 * t for t in t_f], t_w=0.27, mem_f=1.0,
                          mem_b=-2 / 3, mem_w=-1 / 3)
        schedule = generate(base, pp=pp, num_microbatches=num_microbatches, costs=costs,
                            fill_gaps=2000)
        assert schedule.meta["gap_fill"]["moves"] > 0, name
    else:
        schedule = generate(base, pp=pp, num_microbatches=num_microbatches, costs=costs)
    return lower(schedule, costs, post_validation=option == "pv")


def runtime_config_for(name: str):
    """``+hdr`` schedules send shape headers instead of deriving shapes from the data."""
    from odc_pp.runtime import RuntimeConfig

    return RuntimeConfig(shapes_from_microbatch=not name.endswith("+hdr"))


def pipeline_run(config, schedule, microbatches, groups, *, steps=STEPS, runtime_config=None,
                 max_grad_norm=None):
    """Train ``steps`` minibatches; with ``max_grad_norm`` through a PostValidatedOptimizer
    stepped at the schedule's POST_VALIDATION action and validated at the next one's (a
    minibatch whose previous step was rolled back or clipped runs again)."""
    from odc_pp.megatron.model import build_chunks
    from odc_pp.runtime import (PipelineRuntime, PostValidatedOptimizer, PostValidationConfig,
                                RuntimeConfig)

    rank = dist.get_rank()
    chunks = build_chunks(config, pp_rank=rank, pp_size=schedule.pp,
                          num_chunks=schedule.num_chunks, placement=schedule.placement,
                          process_groups=groups)
    params = [p for chunk in chunks for p in chunk.parameters()]
    optimizer = torch.optim.AdamW(params, lr=LR)
    validator = None
    if max_grad_norm is not None:
        validator = PostValidatedOptimizer(PostValidationConfig(max_grad_norm=max_grad_norm),
                                           optimizer=optimizer, group=dist.group.WORLD)
    runtime = PipelineRuntime(runtime_config or RuntimeConfig(), chunks=chunks,
                              pp_group=dist.group.WORLD, optimizer_step=validator)
    losses, results = [], []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        result = runtime.run_minibatch(schedule, microbatches)
        while result.repeat:
            result = runtime.run_minibatch(schedule, microbatches)
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, result.loss_sum)
        losses.append(sum(x for x in gathered if x is not None) / result.num_tokens)
        results.append(result)
        if validator is None:
            optimizer.step()
    if validator is not None:
        validator.validate()
        results.append([outcome.action for outcome in validator.history])
    named = {name: p.detach().clone() for chunk in chunks
             for name, p in chunk.global_named_parameters()}
    return losses, named, results


def max_relative_difference(params, reference) -> float:
    worst = 0.0
    for name, expected in reference.items():
        actual = params[name]
        scale = expected.abs().max().clamp_min(1e-12)
        worst = max(worst, float((actual.float() - expected.float()).abs().max() / scale))
    return worst


def parity_worker(rank, world_size, schedule_names, num_microbatches, out_path):
    from odc_pp.training.distributed import standalone_process_groups

    groups = standalone_process_groups()
    microbatches = make_microbatches(num_microbatches)
    references = {}
    report = {}
    for name in schedule_names:
        clip = CLIP_NORM if name.endswith("+pv") else None
        config = model_config(params_dtype="bfloat16" if name.endswith("+bf16") else "float32")
        if rank == 0 and (clip, config.params_dtype) not in references:
            references[(clip, config.params_dtype)] = reference_run(
                config, microbatches, groups, max_grad_norm=clip)
        reference = references.get((clip, config.params_dtype))
        schedule = build_schedule(name, world_size, num_microbatches)
        losses, named, results = pipeline_run(config, schedule, microbatches, groups,
                                              max_grad_norm=clip,
                                              runtime_config=runtime_config_for(name))
        everything = [None] * world_size
        dist.all_gather_object(everything, named)
        if rank == 0:
            merged = {k: v for part in everything for k, v in part.items()}
            missing = sorted(set(reference[1]) - set(merged))
            ref_losses = reference[0]
            report[name] = {
                "losses": losses, "reference_losses": ref_losses,
                "loss_rel_diff": max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses)),
                "param_rel_diff": max_relative_difference(merged, reference[1]),
                "missing": missing,
                "post_validation": results[-1] if clip is not None else None,
            }
    if rank == 0:
        with open(out_path, "w") as handle:
            json.dump(report, handle)


def layout_schedule(name: str, layout, num_microbatches: int):
    """``name``'s lowered schedule on the stages of ``layout`` (a StageLayout), generated
    for costs scaled by each stage's layers."""
    from odc_pp.schedule.costs import CostModel, with_stage_sizes
    from odc_pp.schedule.generators import family, generate
    from odc_pp.schedule.lowering import lower
    from odc_pp.schedule.placement import locate

    pp = layout.pp
    ranks = [locate(family(name).placement, pp, layout.num_chunks, s)[0]
             for s in range(layout.num_stages)]
    costs = with_stage_sizes(CostModel(offload_bandwidth=1.0), layout.relative_sizes(), ranks)
    schedule = generate(name, pp=pp, num_microbatches=num_microbatches, costs=costs)
    return lower(schedule, costs)


def layers_of(named) -> list[int]:
    """The global decoder layers whose parameters a rank holds."""
    prefix = "model.decoder.layers."
    return sorted({int(name[len(prefix):].split(".")[0]) for name in named
                   if name.startswith(prefix)})


def layout_worker(rank, world_size, names, num_microbatches, out_path, layout_of):
    """Each family of ``names`` on the stages ``layout_of(name, pp)`` gives (uneven or
    with the embedding / loss accounted) against one process: which layers each rank
    holds, and the losses' and parameters' relative differences (rank 0 writes them)."""
    from odc_pp.schedule.generators import family
    from odc_pp.schedule.placement import rank_stages
    from odc_pp.training.distributed import standalone_process_groups

    groups = standalone_process_groups()
    microbatches = make_microbatches(num_microbatches)
    references, report = {}, {}
    for name in names:
        layout = layout_of(name, world_size)
        if rank == 0 and layout.num_layers not in references:
            references[layout.num_layers] = reference_run(
                model_config(num_layers=layout.num_layers), microbatches, groups)
        config = model_config(num_layers=layout.num_layers,
                              num_layers_in_first_pipeline_stage=layout.first,
                              num_layers_in_last_pipeline_stage=layout.last,
                              account_for_embedding_in_pipeline_split=layout.account_embedding,
                              account_for_loss_in_pipeline_split=layout.account_loss)
        schedule = layout_schedule(name, layout, num_microbatches)
        losses, named, _ = pipeline_run(config, schedule, microbatches, groups)
        everything = [None] * world_size
        dist.all_gather_object(everything, named)
        if rank == 0:
            reference = references[layout.num_layers]
            merged = {k: v for part in everything for k, v in part.items()}
            placement = family(name).placement
            report[name] = {
                "rank_layers": [layers_of(part) for part in everything],
                "expected_rank_layers": [
                    sorted(layer for stage in rank_stages(placement, world_size,
                                                          layout.num_chunks, r)
                           for layer in layout.layers(stage)) for r in range(world_size)],
                "counts": list(layout.counts()), "chunks": layout.num_chunks,
                "missing": sorted(set(reference[1]) ^ set(merged)),
                "loss_rel_diff": max(abs(a - b) / abs(b)
                                     for a, b in zip(losses, reference[0])),
                "param_rel_diff": max_relative_difference(merged, reference[1])}
    if rank == 0:
        with open(out_path, "w") as handle:
            json.dump(report, handle)
