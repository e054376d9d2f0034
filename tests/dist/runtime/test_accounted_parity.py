"""Megatron's --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split
(the embedding / the loss counted as one layer of the split): every schedule family on
pp=2 -- stages holding no decoder layer at all included (2 layers over 2 ranks x 2 chunks:
0, 1, 1, 0) -- its schedule made for the per-stage costs of that layout, trains the
megatron-core GPT exactly like a single-process run (the tolerance of test_parity.py)."""

import json

import pytest

from odc_pp.testing.launch import LaunchConfig, run_workers
from tests.dist.runtime.test_parity import SCHEDULES, TOLERANCE
from tests.dist.runtime.test_uneven_parity import _layers_of

# by chunks per rank: (layers, embedding accounted, loss accounted) and the counts
LAYOUTS = {1: (3, True, False), 2: (2, True, True)}
COUNTS = {1: [1, 2], 2: [0, 1, 1, 0]}


def _layout(name: str, pp: int):
    from odc_pp.schedule.generators import family
    from odc_pp.schedule.stage_layout import StageLayout

    chunks = family(name).default_chunks
    layers, embedding, loss = LAYOUTS[chunks]
    return StageLayout.resolve(layers, pp, chunks, account_embedding=embedding,
                               account_loss=loss)


def _schedule(name: str, pp: int, num_microbatches: int):
    """``name``'s lowered schedule, generated for costs scaled by each stage's layers."""
    from odc_pp.schedule.costs import CostModel, with_stage_sizes
    from odc_pp.schedule.generators import family, generate
    from odc_pp.schedule.lowering import lower
    from odc_pp.schedule.placement import locate

    layout = _layout(name, pp)
    ranks = [locate(family(name).placement, pp, layout.num_chunks, s)[0]
             for s in range(layout.num_stages)]
    costs = with_stage_sizes(CostModel(offload_bandwidth=1.0), layout.relative_sizes(), ranks)
    schedule = generate(name, pp=pp, num_microbatches=num_microbatches, costs=costs)
    return lower(schedule, costs), layout


def accounted_worker(rank, world_size, names, num_microbatches, out_path):
    import torch.distributed as dist

    from odc_pp.schedule.generators import family
    from odc_pp.schedule.placement import rank_stages
    from odc_pp.training.distributed import standalone_process_groups
    from tests.dist.runtime._parity import (make_microbatches, max_relative_difference,
                                            model_config, pipeline_run, reference_run)

    groups = standalone_process_groups()
    microbatches = make_microbatches(num_microbatches)
    references, report = {}, {}
    for name in names:
        schedule, layout = _schedule(name, world_size, num_microbatches)
        if rank == 0 and layout.num_layers not in references:
            references[layout.num_layers] = reference_run(
                model_config(num_layers=layout.num_layers), microbatches, groups)
        config = model_config(num_layers=layout.num_layers,
                              account_for_embedding_in_pipeline_split=layout.account_embedding,
                              account_for_loss_in_pipeline_split=layout.account_loss)
        losses, named, _ = pipeline_run(config, schedule, microbatches, groups)
        everything = [None] * world_size
        dist.all_gather_object(everything, named)
        if rank == 0:
            reference = references[layout.num_layers]
            merged = {k: v for part in everything for k, v in part.items()}
            placement = family(name).placement
            report[name] = {
                "rank_layers": [_layers_of(part) for part in everything],
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


@pytest.mark.multiproc
def test_families_train_the_accounted_split_like_one_process(tmp_path):
    out = tmp_path / "accounted.json"
    run_workers(accounted_worker, 2, SCHEDULES, 8, str(out),
                config=LaunchConfig(timeout_s=400))
    report = json.loads(out.read_text())
    assert sorted(report) == sorted(SCHEDULES)
    for name, entry in report.items():
        assert entry["counts"] == COUNTS[entry["chunks"]], (name, entry)
        assert entry["rank_layers"] == entry["expected_rank_layers"], (name, entry)
        assert not entry["missing"], (name, entry)
        assert entry["loss_rel_diff"] <= TOLERANCE, (name, entry)
        assert entry["param_rel_diff"] <= TOLERANCE, (name, entry)
