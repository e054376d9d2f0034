"""Megatron's --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split
(the embedding / the loss counted as one layer of the split): every schedule family on
pp=2 -- stages holding no decoder layer at all included (2 layers over 2 ranks x 2 chunks:
0, 1, 1, 0) -- its schedule made for the per-stage costs of that layout, trains the
megatron-core GPT exactly like a single-process run (the tolerance of test_parity.py)."""

import json

import pytest

from odc_pp.testing.launch import LaunchConfig, run_workers
from tests.dist.runtime.test_parity import SCHEDULES, TOLERANCE

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


def accounted_worker(rank, world_size, names, num_microbatches, out_path):
    from tests.dist.runtime._parity import layout_worker

    layout_worker(rank, world_size, names, num_microbatches, out_path, _layout)


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
