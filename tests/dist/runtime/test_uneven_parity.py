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


def _uneven_layout(name: str, pp: int):
    """``name``'s StageLayout of :data:`LAYOUTS` at ``pp``."""
    from odc_pp.schedule.generators import family
    from odc_pp.schedule.stage_layout import StageLayout

    chunks = family(name).default_chunks
    layers, first, last = LAYOUTS[pp][chunks]
    return StageLayout.resolve(layers, pp, chunks, first=first, last=last)


def uneven_worker(rank, world_size, names, num_microbatches, out_path):
    from tests.dist.runtime._parity import layout_worker

    layout_worker(rank, world_size, names, num_microbatches, out_path, _uneven_layout)


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
