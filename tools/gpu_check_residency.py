"""The ``train-dp2-residency`` stage of ``tools/gpu_check.py`` (issue 50, item 4):
``--odc-param-residency layer`` against ``minibatch`` at dp=2 with both ranks on one GPU
(ODC over CUDA IPC, gloo for the collectives, as ``train-dp2-shared``), the same flags
otherwise. Targets: ``layer``'s median step time at most :data:`LAYER_OVER_MINIBATCH`
times ``minibatch``'s (each layer's gather issued ahead on the transport's gather streams
while the previous layer computes), and equal losses (the gathered values are copies).
Both runs' step times and losses go into the check details of ``gpu_check.json``."""

from __future__ import annotations

import json
import statistics

from gpu_check_common import Check, _train, _training_check, compare_losses

__all__ = ["LAYER_OVER_MINIBATCH", "RESIDENCY_FLAGS", "residency_checks",
           "stage_dp2_residency"]

LAYER_OVER_MINIBATCH = 1.1
"""Target: layer residency's median step time over minibatch residency's."""
WARMUP_STEPS = 2
"""Steps left out of the median (allocation, first gathers, CUDA IPC mappings)."""
RESIDENCY_FLAGS = ["--num-layers", "8", "--hidden-size", "512", "--num-attention-heads", "8",
                   "--seq-length", "1024", "--max-position-embeddings", "1024",
                   "--mock-data", "--vocab-size", "4096", "--micro-batch-size", "2",
                   "--global-batch-size", "16", "--bf16", "--lr", "1e-3", "--min-lr", "1e-4",
                   "--lr-warmup-iters", "2", "--seed", "7", "--no-progress-bar",
                   "--log-interval", "1", "--train-iters", "8",
                   "--pipeline-model-parallel-size", "1", "--pipeline-schedule", "1f1b",
                   "--dp-mode", "odc", "--distributed-backend", "gloo",
                   "--distributed-timeout-minutes", "3"]
"""A model whose layers compute long enough to hide a layer's gather (8 layers)."""


def residency_checks(minibatch: list[dict], layer: list[dict]) -> list[Check]:
    """The comparison of the two runs' JSON log records (``step_s``, ``loss``)."""
    steps = {name: [r["step_s"] for r in records[WARMUP_STEPS:] if r.get("step_s")]
             for name, records in (("minibatch", minibatch), ("layer", layer))}
    if not steps["minibatch"] or not steps["layer"]:
        return [Check(name="residency_layer_step_time", passed=False,
                      detail=f"no step times after {WARMUP_STEPS} warm-up steps: {steps}")]
    medians = {name: statistics.median(values) for name, values in steps.items()}
    ratio = medians["layer"] / medians["minibatch"]
    losses = {name: [r["loss"] for r in records]
              for name, records in (("minibatch", minibatch), ("layer", layer))}
    ok, detail = compare_losses(losses["minibatch"], losses["layer"])
    return [Check(name="residency_layer_step_time", passed=ratio <= LAYER_OVER_MINIBATCH,
                  detail=json.dumps({"layer_over_minibatch": round(ratio, 4),
                                     "target": LAYER_OVER_MINIBATCH,
                                     "median_step_s": medians, "step_s": steps})),
            Check(name="residency_layer_losses_equal", passed=ok,
                  detail=f"bitwise equal: {losses['minibatch'] == losses['layer']}; {detail}")]


def stage_dp2_residency(context) -> list[Check]:
    env = {"CUDA_VISIBLE_DEVICES": "0"}
    runs = {}
    for residency in ("minibatch", "layer"):
        runs[residency] = _train(context, f"train-dp2-residency-{residency}",
                                 RESIDENCY_FLAGS + ["--odc-param-residency", residency],
                                 timeout_s=200, nproc=2, env=env)
    checks = [_training_check(f"train_dp2_residency_{name}", *run, 8)
              for name, run in runs.items()]
    if not all(check.passed for check in checks):
        return checks + [Check(name="residency_layer_step_time", passed=False,
                               detail="a run failed (see the two checks above)")]
    return checks + residency_checks(runs["minibatch"][2], runs["layer"][2])
