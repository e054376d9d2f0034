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
from odc_pp.schedule.validate import validate

GOLDEN_DIR = Path(__file__).resolve().parents[2] / "golden"
UPDATE = os.environ.get("ODC_PP_UPDATE_GOLDEN") == "1"
COSTS = CostModel(offload_bandwidth=2.0)  # offload needs a host-link bandwidth
CASES = [(name, 4, 8) for name in FAMILY_NAMES if name != "zb-auto"] + [
    ("interleaved", 2, 5), ("zbv", 3, 4), ("v-min", 3, 6)]


def _golden_text(schedule: Schedule) -> str:
    """JSON with one action per line, so a changed schedule gives a readable diff."""
    data = schedule.to_dict()
    ranks = data.pop("ranks")
    head = json.dumps(data, sort_keys=True)[:-1]
    rank_texts = ["  [\n" + ",\n".join("   " + json.dumps(a, sort_keys=True) for a in rank)
                  + "\n  ]" for rank in ranks]
    return head + ',\n "ranks": [\n' + ",\n".join(rank_texts) + "\n ]\n}\n"


@pytest.mark.parametrize("name,pp,num_microbatches", CASES)
def test_matches_golden(name, pp, num_microbatches):
    schedule = generate(name, pp=pp, num_microbatches=num_microbatches, costs=COSTS)
    path = GOLDEN_DIR / f"{name}_pp{pp}_m{num_microbatches}.json"
    if UPDATE:
        GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
        path.write_text(_golden_text(schedule))
    assert path.exists(), f"{path} missing: run with ODC_PP_UPDATE_GOLDEN=1 to create it"
    stored = Schedule.from_dict(json.loads(path.read_text()))
    validate(stored, COSTS)
    assert stored.to_dict() == json.loads(json.dumps(schedule.to_dict())), (
        f"{name} changed; if intended, regenerate with ODC_PP_UPDATE_GOLDEN=1")
