"""Uneven pipeline stages (Megatron's --decoder-first/last-pipeline-num-layers): every
schedule family on pp=2, its schedule made for the per-stage costs of the uneven layout,
trains the megatron-core GPT exactly like a single-process run (3 AdamW steps,
microbatches of different lengths, the tolerance of test_parity.py)."""

import json

import pytest

from odc_pp.testing.launch import LaunchConfig, run_workers
from tests.dist.runtime.test_parity import SCHEDULES, TOLERANCE

# 6 layers: the first stage 2, the last 4 (Megatron's meaning): one chunk a rank gives
# stages of 2 and 4 layers, two chunks (each of a rank's chunks half its layers) 1, 2, 1, 2
LAYERS, FIRST, LAST = 6, 2, 4


def _uneven_schedule(name: str, pp: int, num_microbatches: int):
    """``name``'s lowered schedule, generated for costs scaled by each stage's layers."""
    from odc_pp.schedule.costs import CostModel, with_stage_sizes
    from odc_pp.schedule.generators import family, generate
    from odc_pp.schedule.lowering import lower
    from odc_pp.schedule.placement import locate
    from odc_pp.schedule.stage_layout import StageLayout

    fam = family(name)
    layout = StageLayout.resolve(LAYERS, pp, fam.default_chunks, first=FIRST, last=LAST)
    ranks = [locate(fam.placement, pp, layout.num_chunks, s)[0]
             for s in range(layout.num_stages)]
    costs = with_stage_sizes(CostModel(offload_bandwidth=1.0), layout.relative_sizes(), ranks)
    schedule = generate(name, pp=pp, num_microbatches=num_microbatches, costs=costs)
    return lower(schedule, costs), layout


def uneven_worker(rank, world_size, names, num_microbatches, out_path):
    import torch.distributed as dist

    from odc_pp.training.distributed import standalone_process_groups
    from tests.dist.runtime._parity import (make_microbatches, max_relative_difference,
                                            model_config, pipeline_run, reference_run)

    groups = standalone_process_groups()
    microbatches = make_microbatches(num_microbatches)
    reference = reference_run(model_config(num_layers=LAYERS), microbatches, groups) \
        if rank == 0 else None
    config = model_config(num_layers=LAYERS, num_layers_in_first_pipeline_stage=FIRST,
                          num_layers_in_last_pipeline_stage=LAST)
    report = {}
    for name in names:
        schedule, layout = _uneven_schedule(name, world_size, num_microbatches)
        losses, named, _ = pipeline_run(config, schedule, microbatches, groups)
        everything = [None] * world_size
        dist.all_gather_object(everything, named)
        if rank == 0:
            merged = {k: v for part in everything for k, v in part.items()}
            report[name] = {
                "counts": list(layout.counts()),
                "missing": sorted(set(reference[1]) ^ set(merged)),
                "loss_rel_diff": max(abs(a - b) / abs(b)
                                     for a, b in zip(losses, reference[0])),
                "param_rel_diff": max_relative_difference(merged, reference[1])}
    if rank == 0:
        with open(out_path, "w") as handle:
            json.dump(report, handle)


@pytest.mark.multiproc
def test_every_family_trains_uneven_stages_like_one_process(tmp_path):
    out = tmp_path / "uneven.json"
    run_workers(uneven_worker, 2, SCHEDULES, 8, str(out), config=LaunchConfig(timeout_s=400))
    report = json.loads(out.read_text())
    assert sorted(report) == sorted(SCHEDULES)
    for name, entry in report.items():
        assert entry["counts"] in ([2, 4], [1, 2, 1, 2]), (name, entry)
        assert not entry["missing"], (name, entry)
        assert entry["loss_rel_diff"] <= TOLERANCE, (name, entry)
        assert entry["param_rel_diff"] <= TOLERANCE, (name, entry)
