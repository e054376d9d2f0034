"""Golden schedules: small generated schedules stored as JSON in tests/golden/.

Regenerate after an intended change with ``ODC_PP_UPDATE_GOLDEN=1 pytest tests/unit/schedule/
test_generators_golden.py`` and review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from odc_pp.schedule import CostModel, Schedule
from odc_pp.schedule.generators import FAMILY_NAMES, generate
from odc_pp.schedule.lowering import insert_offload
from odc_pp.schedule.validate import validate

GOLDEN_DIR = Path(__file__).resolve().parents[2] / "golden"
UPDATE = os.environ.get("ODC_PP_UPDATE_GOLDEN") == "1"
COSTS = CostModel(offload_bandwidth=2.0)  # offload needs a host-link bandwidth
CASES = [(name, 4, 8) for name in FAMILY_NAMES if name != "zb-auto"] + [
    ("interleaved", 2, 5), ("zbv", 3, 4), ("v-min", 3, 6)]
# PipeOffload's group-interleaved orders (gis at g = ceil(pp/2) is a CASES row): GIS at
# g = 3 and 4, offload on the uniform repeating order (g = 1) and on GIS at g = 2 (GIS-H)
GROUPED = [("gis", 4, 8, 3), ("gis", 4, 8, 4), ("offload", 4, 8, 1), ("offload", 4, 8, 2)]


def _golden_text(schedule: Schedule) -> str:
    """JSON with one action per line, so a changed schedule gives a readable diff."""
    data = schedule.to_dict()
    ranks = data.pop("ranks")
    head = json.dumps(data, sort_keys=True)[:-1]
    rank_texts = ["  [\n" + ",\n".join("   " + json.dumps(a, sort_keys=True) for a in rank)
                  + "\n  ]" for rank in ranks]
    return head + ',\n "ranks": [\n' + ",\n".join(rank_texts) + "\n ]\n}\n"


def _check_golden(schedule: Schedule, path: Path) -> None:
    if UPDATE:
        GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
        path.write_text(_golden_text(schedule))
    assert path.exists(), f"{path} missing: run with ODC_PP_UPDATE_GOLDEN=1 to create it"
    stored = Schedule.from_dict(json.loads(path.read_text()))
    validate(stored, COSTS)
    assert stored.to_dict() == json.loads(json.dumps(schedule.to_dict())), (
        f"{path.name} changed; if intended, regenerate with ODC_PP_UPDATE_GOLDEN=1")


@pytest.mark.parametrize("name,pp,num_microbatches", CASES)
def test_matches_golden(name, pp, num_microbatches):
    schedule = generate(name, pp=pp, num_microbatches=num_microbatches, costs=COSTS)
    _check_golden(schedule, GOLDEN_DIR / f"{name}_pp{pp}_m{num_microbatches}.json")


@pytest.mark.parametrize("name,pp,num_microbatches,group_size", GROUPED)
def test_group_interleaved_matches_golden(name, pp, num_microbatches, group_size):
    schedule = generate(name, pp=pp, num_microbatches=num_microbatches, costs=COSTS,
                        group_size=group_size)
    _check_golden(schedule, GOLDEN_DIR / f"{name}_pp{pp}_m{num_microbatches}_g{group_size}"
                                         f".json")


@pytest.mark.parametrize("offload_chunks,label", [([0], "po-h"), ([0, 1], "po-f")])
def test_selective_offload_matches_golden(offload_chunks, label):
    """PO-H / PO-F: the uniform repeating order (g = 1) with selective offload of the
    first chunk / every chunk (link time 1 / 2: some passes too short to hide)."""
    compute = generate("offload", pp=4, num_microbatches=8, costs=COSTS, group_size=1)
    schedule = insert_offload(compute, COSTS, offload_chunks, selective=True)
    assert any(a.kind.value == "OFFLOAD" for a in schedule.actions())
    _check_golden(schedule, GOLDEN_DIR / f"offload_pp4_m8_g1_{label}.json")
