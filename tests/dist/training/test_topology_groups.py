"""Every process group of a training rank is made by ``Topology`` (issue 52): the groups
megatron-core's modules see (each rank alone), the tied, hierarchical and context-parallel
groups and the pipeline channels are all made in ``Topology.for_job``, each with the job's
``--distributed-timeout-minutes``, and each group a rank belongs to is among the
communicators the start-up warm-up walks. Building the model, the engine and the optimizer
afterwards makes no group.

``dist.new_group`` is wrapped for the test (counted, then restored), on 4 gloo ranks.
"""

from __future__ import annotations

import pytest

from odc_pp.testing.launch import LaunchConfig, run_workers

FLAGS = ["--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4",
         "--seq-length", "32", "--mock-data", "--vocab-size", "256",
         "--micro-batch-size", "1", "--global-batch-size", "8", "--train-iters", "1",
         "--distributed-timeout-minutes", "0.75"]
WORLD = 4

LAYOUTS = {
    "pp2-dp2-zbv-tied": ["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "zbv"],
    "tp2-cp2": ["--tensor-model-parallel-size", "2", "--context-parallel-size", "2"],
    "dp4-hierarchical": ["--dp-mode", "hierarchical", "--dp-ranks-per-host", "2"],
}


def worker(rank, world_size, extra):
    import torch
    import torch.distributed as dist

    from odc_pp.training.arguments import parse_args
    from odc_pp.training.components import build_components
    from odc_pp.training.distributed import Topology, warm_up_topology

    made, original = [], dist.new_group

    def recording(ranks=None, *args, **kwargs):
        group = original(ranks, *args, **kwargs)
        made.append((sorted(ranks), group, kwargs.get("timeout")))
        return group

    dist.new_group = recording
    try:
        job = parse_args(FLAGS + extra).resolve(world_size)
        topo = Topology.for_job(job, rank, torch.device("cpu"))
        warm_up_topology(topo, timeout_s=60)
        by_topology = len(made)
        parts = build_components(job, topo, vocab_size=256)
        parts.close()
    finally:
        dist.new_group = original
    known = {id(comm.group) for comm in topo.communicators}
    return {"by_topology": by_topology,
            "after_topology": [ranks for ranks, _, _ in made[by_topology:]],
            "not_in_communicators": [ranks for ranks, group, _ in made
                                     if rank in ranks and id(group) not in known],
            "timeouts": sorted({str(timeout) for _, _, timeout in made}),
            "kinds": sorted({comm.kind for comm in topo.communicators}),
            "job_timeout_s": job.timeout_s}


@pytest.mark.multiproc
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_every_group_is_made_by_the_topology_with_the_job_timeout(layout):
    results = run_workers(worker, WORLD, LAYOUTS[layout],
                          config=LaunchConfig(timeout_s=240))
    for rank, result in enumerate(results):
        assert result["after_topology"] == [], (rank, result)  # the model made none
        assert result["not_in_communicators"] == [], (rank, result)
        assert result["by_topology"] >= WORLD, (rank, result)  # each rank alone, at least
        assert result["timeouts"] == ["0:00:45"], (rank, result)  # 0.75 minutes, every one
        assert "self" in result["kinds"], (rank, result)
    kinds = set(results[0]["kinds"])
    expected = {"pp2-dp2-zbv-tied": {"pp", "dp", "tied", "p2p"},
                "tp2-cp2": {"tp", "cp"},
                "dp4-hierarchical": {"dp", "dp-intra", "dp-inter", "norm"}}[layout]
    assert expected <= kinds, (layout, kinds)
