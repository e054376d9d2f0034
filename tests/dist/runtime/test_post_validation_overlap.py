"""Overlapped post-validation through the runtime (pp=2, zb-h2 and zbv, gloo): each step
is taken eagerly at POST_VALIDATION and validated at the next minibatch's; a rolled-back
or clipped step makes the runtime repeat the minibatch that ran on it. Losses, parameters
and AdamW state equal, bit for bit, the same pipeline stepped synchronously (global check,
skip or clip, step) -- with clipping on every step and with an inf injected on one rank.
A compute-only schedule is refused (the runtime has no implicit communication)."""

import json

import pytest
import torch
import torch.distributed as dist

from odc_pp.testing.launch import LaunchConfig, run_workers
from tests.dist.runtime._parity import LR, build_schedule, make_microbatches, model_config

STEPS = 4
INJECT_STEP = 1  # rank 1 writes inf into a gradient of this step
# (max_grad_norm, outcomes): 0.05 clips every finite step of the tiny model; None never
CASES = {"clip": (0.05, ["clipped", "skipped", "clipped", "clipped"]),
         "noclip": (None, ["accepted", "skipped", "accepted", "accepted"])}


def _inject(params):
    params[0].grad.view(-1)[0] = float("inf")


def _build(name):
    from odc_pp.training.distributed import standalone_process_groups
    from odc_pp.megatron.model import build_chunks

    schedule = build_schedule(name + "+pv", dist.get_world_size(), 4)
    chunks = build_chunks(model_config(), pp_rank=dist.get_rank(), pp_size=schedule.pp,
                          num_chunks=schedule.num_chunks, placement=schedule.placement,
                          process_groups=standalone_process_groups())
    params = [p for chunk in chunks for p in chunk.parameters()]
    return schedule, chunks, params, torch.optim.AdamW(params, lr=LR)


def _loss(result):
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, result.loss_sum)
    return sum(x for x in gathered if x is not None) / result.num_tokens


def synchronous(name, max_norm, microbatches):
    from odc_pp.runtime import PipelineRuntime, RuntimeConfig
    from odc_pp.optim import clip

    schedule, chunks, params, optimizer = _build(name)
    runtime = PipelineRuntime(RuntimeConfig(), chunks=chunks, pp_group=dist.group.WORLD)
    losses, outcomes = [], []
    for step in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        losses.append(_loss(runtime.run_minibatch(schedule, microbatches)))
        if step == INJECT_STEP and dist.get_rank() == 1:
            _inject(params)
        grads = [p.grad for p in params if p.grad is not None]
        state = clip.global_grad_state(
            clip.local_sum_of_squares(grads, dtype=torch.float64, device="cpu"),
            dist.group.WORLD, device="cpu", timeout_s=60)
        if not state.finite:
            outcomes.append("skipped")
            continue
        clipped = max_norm is not None and clip.clip_(grads, state, max_norm)
        outcomes.append("clipped" if clipped else "accepted")
        optimizer.step()
    return losses, outcomes, params, optimizer, 0


def overlapped(name, max_norm, microbatches):
    from odc_pp.runtime import (PipelineRuntime, PostValidatedOptimizer,
                                PostValidationConfig, RuntimeConfig)
    from odc_pp.optim.post_validation import TorchOptimizerTarget

    schedule, chunks, params, optimizer = _build(name)

    class Injecting(TorchOptimizerTarget):
        armed = False

        def local_grad_norm_sq(self):
            if self.armed:
                _inject(params)
            return super().local_grad_norm_sq()

    target = Injecting(optimizer)
    validator = PostValidatedOptimizer(PostValidationConfig(max_grad_norm=max_norm),
                                       optimizer=target, group=dist.group.WORLD)
    runtime = PipelineRuntime(RuntimeConfig(), chunks=chunks, pp_group=dist.group.WORLD,
                              optimizer_step=validator)
    losses, repeats = [], 0
    for step in range(STEPS):
        target.armed = step == INJECT_STEP and dist.get_rank() == 1
        result = runtime.run_minibatch(schedule, microbatches)
        while result.repeat:  # the previous step changed: this minibatch ran on stale weights
            repeats += 1
            assert all(p.grad is None for p in params)  # its gradients were dropped
            result = runtime.run_minibatch(schedule, microbatches)
        losses.append(_loss(result))
    validator.validate()  # the last step: nothing runs after it
    return losses, [o.action for o in validator.history], params, optimizer, repeats


def worker(rank, world_size, out_path):
    microbatches = make_microbatches(4)
    report = {}
    for name in ("zb-h2", "zbv"):
        for case, (max_norm, _) in CASES.items():
            sync = synchronous(name, max_norm, microbatches)
            over = overlapped(name, max_norm, microbatches)
            same_params = all(torch.equal(a, b) for a, b in zip(sync[2], over[2]))
            same_state = all(
                torch.equal(sync[3].state[a][key], over[3].state[b][key])
                for a, b in zip(sync[2], over[2]) for key in sync[3].state[a])
            report[f"{name}/{case}"] = {
                "sync_losses": sync[0], "losses": over[0], "sync_outcomes": sync[1],
                "outcomes": over[1], "same_params": same_params, "same_state": same_state,
                "repeats": over[4]}
    report["unlowered"] = _unlowered_error(microbatches)
    with open(f"{out_path}.{rank}", "w") as handle:
        json.dump(report, handle)


def _unlowered_error(microbatches):
    """The runtime refuses a compute-only schedule (no implicit communication)."""
    from odc_pp.runtime import PipelineRuntime, RuntimeConfig
    from odc_pp.schedule.generators import generate

    compute = generate("zb-h2", pp=dist.get_world_size(), num_microbatches=4)
    _, chunks, _, _ = _build("zb-h2")
    runtime = PipelineRuntime(RuntimeConfig(), chunks=chunks, pp_group=dist.group.WORLD)
    try:
        runtime.run_minibatch(compute, microbatches)
    except ValueError as exc:
        return str(exc)
    return None


@pytest.mark.multiproc
def test_overlapped_post_validation_equals_synchronous_bitwise(tmp_path):
    run_workers(worker, 2, str(tmp_path / "overlap"), config=LaunchConfig(timeout_s=400))
    for rank in range(2):
        report = json.loads((tmp_path / f"overlap.{rank}").read_text())
        assert "is not lowered" in (report["unlowered"] or ""), report["unlowered"]
        assert "lower_communication" in report["unlowered"]
        for name in ("zb-h2", "zbv"):
            for case, (_, expected) in CASES.items():
                entry = report[f"{name}/{case}"]
                assert entry["sync_outcomes"] == expected, entry
                assert entry["outcomes"] == expected, entry
                assert entry["losses"] == entry["sync_losses"], entry  # bitwise
                assert entry["same_params"] and entry["same_state"], entry
                # every step but the last that was not accepted made the next one repeat
                assert entry["repeats"] == sum(o != "accepted" for o in expected[:-1])
