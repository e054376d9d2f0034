"""Export to torch.distributed.pipelining's CSV and load it with the real PyTorch loader.

A real ``_PipelineScheduleRuntime`` is built for rank 0 of a ``pp``-rank job on torch's
in-process "fake" process group (real ``PipelineStage`` objects, no peers needed). Its
``_load_csv(..., format="compute_only")`` parses our CSV, validates it with torch's own
checks, infers the stage -> rank mapping and lowers it with torch's communication pass;
torch's dry-run simulator must then find no deadlock. Torch's dump of what it loaded,
read back into our IR, must equal the original schedule.
"""

from __future__ import annotations

import os
import tempfile

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from torch.distributed.pipelining import PipelineStage  # noqa: E402
from torch.distributed.pipelining import schedules as pipelining  # noqa: E402

from odc_pp.schedule import CostModel, Schedule  # noqa: E402
from odc_pp.schedule.generators import generate  # noqa: E402

NAMES = ["1f1b", "interleaved", "zb-h1", "zb-h2", "zbv", "v-half", "v-min", "dualpipev",
         "offload"]


@pytest.fixture(scope="module")
def fake_world():
    """A 4-rank fake process group (this process is rank 0)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        pytest.fail("a default process group leaked from another test")
    dist.init_process_group("fake", rank=0, world_size=4, store=FakeStore())
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def _load_with_torch(schedule: Schedule, group) -> pipelining._PipelineScheduleRuntime:
    stages = [PipelineStage(torch.nn.Linear(4, 4), schedule.stage_of(0, chunk),
                            schedule.num_stages, torch.device("cpu"), group=group)
              for chunk in range(schedule.num_chunks)]
    runtime = pipelining._PipelineScheduleRuntime(stages, schedule.num_microbatches,
                                                  loss_fn=lambda out, target: out.sum())
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "schedule.csv")
        with open(path, "w", newline="") as handle:
            handle.write(schedule.to_pipelining_csv())
        runtime._load_csv(path, format="compute_only")
    return runtime


def _dump_compute_only(runtime) -> str:
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "dump.csv")
        runtime._dump_csv(path, format="compute_only")
        with open(path, newline="") as handle:
            return handle.read()


@pytest.mark.parametrize("name", NAMES)
def test_real_loader_accepts_and_round_trips(name, fake_world):
    costs = CostModel(offload_bandwidth=1.0)
    schedule = generate(name, pp=4, num_microbatches=8, costs=costs)
    runtime = _load_with_torch(schedule, fake_world)

    # torch parsed exactly our compute actions, with our placement
    for rank in range(schedule.pp):
        ours = [(schedule.stage_of(rank, a.chunk), a.kind.value, a.microbatch)
                for a in schedule.compute_actions(rank)]
        letters = {"F": "F", "I": "B", "W": "W", "B": "BW"}
        theirs = [(a.stage_index, letters[a.computation_type.value], a.microbatch_index)
                  for a in runtime.pipeline_order[rank]]
        assert theirs == ours
    for stage in range(schedule.num_stages):
        assert runtime.stage_index_to_group_rank[stage] == schedule.locate(stage)[0]

    # torch's own lowering + dry-run simulation find every transfer and no deadlock
    skipped = (pipelining.UNSHARD, pipelining.RESHARD, pipelining.REDUCE_GRAD)
    with_comms = {rank: [a for a in actions if a is not None
                         and a.computation_type not in skipped]
                  for rank, actions in runtime.pipeline_order_with_comms.items()}
    sends = sum(a.computation_type in (pipelining.SEND_F, pipelining.SEND_B)
                for actions in with_comms.values() for a in actions)
    assert sends > 0
    pipelining._simulate_comms_compute(
        with_comms, lambda s: runtime.stage_index_to_group_rank[s], schedule.num_stages)

    back = Schedule.from_pipelining_csv(_dump_compute_only(runtime), name=schedule.name,
                                        num_chunks=schedule.num_chunks,
                                        placement=schedule.placement)
    assert back.num_microbatches == schedule.num_microbatches
    assert back.ranks == schedule.ranks


def test_torch_rejects_a_broken_export(fake_world):
    """The loader really checks: a W before its B is refused."""
    schedule = generate("zb-h1", pp=4, num_microbatches=8)
    ranks = [list(r) for r in schedule.ranks]
    w_index = next(i for i, a in enumerate(ranks[0]) if a.kind.value == "W")
    ranks[0].insert(0, ranks[0].pop(w_index))
    with pytest.raises(AssertionError, match="without first running"):
        _load_with_torch(schedule.copy(ranks=ranks), fake_world)
