"""Uneven pipeline stages (Megatron's --decoder-first/last-pipeline-num-layers): every
schedule family on pp=2 (and the one-chunk ones and zbv on pp=4, first and last stages of
one layer), its schedule made for the per-stage costs of the uneven layout, trains the
megatron-core GPT exactly like a single-process run (3 AdamW steps, microbatches of
different lengths, the tolerance of test_parity.py)."""

import json

import pytest

from odc_pp.testing.launch import LaunchConfig, run_workers
from tests.dist.runtime.test_parity import SCHEDULES, TOLERANCE

# (layers, first, last) by pp and chunks per rank, Megatron's meaning: pp=2, 6 layers, the
# first stage 2 and the last 4: one chunk a rank gives stages of 2 and 4 layers, two (each
# of a rank's chunks half its layers) 1, 2, 1, 2; pp=4: first and last stages of one
# layer (two chunks: of two), the middle stages share the rest
LAYOUTS = {2: {1: (6, 2, 4), 2: (6, 2, 4)}, 4: {1: (6, 1, 1), 2: (12, 2, 2)}}
COUNTS = {2: {1: [2, 4], 2: [1, 2, 1, 2]}, 4: {1: [1, 2, 2, 1], 2: [1, 2, 2, 1] * 2}}


def _uneven_schedule(name: str, pp: int, num_microbatches: int):
    """``name``'s lowered schedule, generated for costs scaled by each stage's layers."""
    from odc_pp.schedule.costs import CostModel, with_stage_sizes
    from odc_pp.schedule.generators import family, generate
    from odc_pp.schedule.lowering import lower
    from odc_pp.schedule.placement import locate
    from odc_pp.schedule.stage_layout import StageLayout

    fam = family(name)
    layers, first, last = LAYOUTS[pp][fam.default_chunks]
    layout = StageLayout.resolve(layers, pp, fam.default_chunks, first=first, last=last)
    ranks = [locate(fam.placement, pp, layout.num_chunks, s)[0]
             for s in range(layout.num_stages)]
    costs = with_stage_sizes(CostModel(offload_bandwidth=1.0), layout.relative_sizes(), ranks)
    schedule = generate(name, pp=pp, num_microbatches=num_microbatches, costs=costs)
    return lower(schedule, costs), layout


def _layers_of(named) -> list[int]:
    """The global decoder layers whose parameters a rank holds."""
    prefix = "model.decoder.layers."
    return sorted({int(name[len(prefix):].split(".")[0]) for name in named
                   if name.startswith(prefix)})


def uneven_worker(rank, world_size, names, num_microbatches, out_path):
    import torch.distributed as dist

    from odc_pp.training.distributed import standalone_process_groups
    from tests.dist.runtime._parity import (make_microbatches, max_relative_difference,
                                            model_config, pipeline_run, reference_run)

    from odc_pp.schedule.generators import family
    from odc_pp.schedule.placement import rank_stages

    groups = standalone_process_groups()
    microbatches = make_microbatches(num_microbatches)
    references, report = {}, {}
    for name in names:
        layers, first, last = LAYOUTS[world_size][family(name).default_chunks]
        if rank == 0 and layers not in references:
            references[layers] = reference_run(model_config(num_layers=layers), microbatches,
                                               groups)
        config = model_config(num_layers=layers, num_layers_in_first_pipeline_stage=first,
                              num_layers_in_last_pipeline_stage=last)
        schedule, layout = _uneven_schedule(name, world_size, num_microbatches)
        losses, named, _ = pipeline_run(config, schedule, microbatches, groups)
        everything = [None] * world_size
        dist.all_gather_object(everything, named)
        if rank == 0:
            reference = references[layers]
            merged = {k: v for part in everything for k, v in part.items()}
            placement, chunks = family(name).placement, family(name).default_chunks
            report[name] = {
                "rank_layers": [_layers_of(part) for part in everything],
                "expected_rank_layers": [
                    sorted(layer for stage in rank_stages(placement, world_size, chunks, r)
                           for layer in layout.layers(stage)) for r in range(world_size)],
                "counts": list(layout.counts()),
                "chunks": family(name).default_chunks,
                "missing": sorted(set(reference[1]) ^ set(merged)),
                "loss_rel_diff": max(abs(a - b) / abs(b)
                                     for a, b in zip(losses, reference[0])),
                "param_rel_diff": max_relative_difference(merged, reference[1])}
    if rank == 0:
        with open(out_path, "w") as handle:
            json.dump(report, handle)


@pytest.mark.multiproc
@pytest.mark.parametrize("pp,names", [(2, SCHEDULES),
                                      (4, ["1f1b", "zb-h1", "zb-auto", "zbv"])])
def test_families_train_uneven_stages_like_one_process(tmp_path, pp, names):
    out = tmp_path / "uneven.json"
    run_workers(uneven_worker, pp, names, 8, str(out), config=LaunchConfig(timeout_s=400))
    report = json.loads(out.read_text())
    assert sorted(report) == sorted(names)
    for name, entry in report.items():
        assert entry["counts"] == COUNTS[pp][entry["chunks"]], (name, entry)
        assert entry["rank_layers"] == entry["expected_rank_layers"], (name, entry)
        assert not entry["missing"], (name, entry)
        assert entry["loss_rel_diff"] <= TOLERANCE, (name, entry)
        assert entry["param_rel_diff"] <= TOLERANCE, (name, entry)
