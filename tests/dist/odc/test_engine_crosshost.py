"""ShardedDataParallel in odc mode on the forced cross-host transport path (every rank its
own "host": gathers and scatter_accumulates go over gloo point-to-point, from the main,
prefetch and accumulate threads at once) against the single-process AdamW reference.
Mirrors the ``odc`` and ``odc_refetch_clip`` scenarios of test_engine.py."""

from __future__ import annotations

import pytest

from odc_pp.testing.launch import LaunchConfig, run_workers

from .test_engine import LR, BETAS, EPS, REL_TOL, STEPS, WD, make_model, params_of, \
    reference_params, rel_diff, train_steps

CLIP = 0.05


def run_cross_host(rank, world, *, keep, clip):
    from odc_pp.odc import primitives as prim
    from odc_pp.odc.engine import OdcConfig, ShardedDataParallel
    from odc_pp.odc.sharded_optimizer import AdamWConfig, ShardedAdamW

    group = prim.new_group(config=prim.TransportConfig(backend="odc", force_cross_host=True,
                                                       timeout_s=60.0))
    assert group.cross_host is not None, "the cross-host path was not taken"
    model = make_model()
    engine = ShardedDataParallel(model.units(), OdcConfig(
        mode="odc", keep_params_through_backward=keep), group)
    optimizer = ShardedAdamW(engine, AdamWConfig(lr=LR, betas=BETAS, eps=EPS, weight_decay=WD))
    counts = train_steps(model, engine, optimizer, STEPS, dp_rank=rank, dp_size=world,
                         clip=clip)
    result = {"params": params_of(engine), "counts": counts}
    engine.destroy()
    group.destroy()
    return result


def worker_cross_host(rank, world):
    # keep=False: parameters are re-gathered (prefetched) during backward while gradients
    # are scatter-accumulated from the engine's thread, the heaviest mix of traffic.
    return {"odc": run_cross_host(rank, world, keep=True, clip=None),
            "odc_refetch_clip": run_cross_host(rank, world, keep=False, clip=CLIP)}


@pytest.mark.multiproc
def test_odc_engine_on_forced_cross_host_path_matches_reference():
    ranks = run_workers(worker_cross_host, 2, config=LaunchConfig(timeout_s=240))
    references = {"odc": reference_params(STEPS, 2, clip=None),
                  "odc_refetch_clip": reference_params(STEPS, 2, clip=CLIP)}
    for name, reference in references.items():
        # the replicas ran different microbatch counts
        assert ranks[0][name]["counts"] != ranks[1][name]["counts"], name
        for rank_results in ranks:
            assert rel_diff(rank_results[name]["params"], reference) <= REL_TOL, name
        for key, value in ranks[0][name]["params"].items():
            assert (value == ranks[1][name]["params"][key]).all(), (name, key)
