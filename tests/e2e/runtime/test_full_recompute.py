"""Full activation recompute (--recompute-granularity full) composed with the B/W split.

pp=2 (one launch, two gloo ranks), every schedule family, hidden dropout 0.1: uniform
(groups of 2) and block (first layer of each chunk) recompute give the loss and the
gradients of the same pipeline without recompute bitwise; the saved bytes of every
(chunk, microbatch) drop as the formula says (each recomputed layer's saved bytes, less
one kept input per group, plus the attention mask once no layer saves it); the deferred W holds what B recomputed (counted from B to W)."""

import json

import pytest
import torch
import torch.distributed as dist

from odc_pp.testing.launch import LaunchConfig, run_workers
from tests.dist.runtime._parity import build_schedule, make_microbatches, model_config

FAMILIES = ("1f1b", "interleaved", "zb-h1", "zb-h2", "zb-auto", "zbv", "v-half", "v-min",
            "offload", "dualpipev")
SEED = 11
DROPOUT = 0.1


def test_recompute_groups_follow_megatron():
    from odc_pp.megatron.full_recompute import recompute_groups

    assert recompute_groups(5, "uniform", 2) == [range(0, 2), range(2, 4), range(4, 5)]
    assert recompute_groups(4, "uniform", 1) == [range(i, i + 1) for i in range(4)]
    assert recompute_groups(4, "block", 3) == [range(0, 1), range(1, 2), range(2, 3)]
    assert recompute_groups(2, "block", 5) == [range(0, 1), range(1, 2)]
    with pytest.raises(ValueError, match="--recompute-method"):
        recompute_groups(4, "selective", 1)


def _run(config, schedule, microbatches, groups):
    from odc_pp.megatron.model import build_chunks
    from odc_pp.runtime import PipelineRuntime, RuntimeConfig

    chunks = build_chunks(config, pp_rank=dist.get_rank(), pp_size=schedule.pp,
                          num_chunks=schedule.num_chunks, placement=schedule.placement,
                          seed=SEED, process_groups=groups)
    runtime = PipelineRuntime(RuntimeConfig(track_activations=True, min_offload_bytes=0),
                              chunks=chunks, pp_group=dist.group.WORLD)
    torch.manual_seed(SEED + dist.get_rank())
    result = runtime.run_minibatch(schedule, microbatches)
    grads = {name: p.grad.clone() for chunk in chunks
             for name, p in chunk.global_named_parameters()}
    layers = {index: len(chunk.layers) for index, chunk in enumerate(chunks)}
    return result, grads, layers


def worker(rank, world_size, out_path):
    from odc_pp.training.distributed import standalone_process_groups

    groups = standalone_process_groups()
    microbatches = make_microbatches(4)
    hidden = model_config().hidden_size
    report = {}
    for name in FAMILIES:
        schedule = build_schedule(name, world_size, len(microbatches))
        stored, stored_grads, layers = _run(model_config(hidden_dropout=DROPOUT), schedule,
                                            microbatches, groups)
        entry = {"layers": layers,
                 "w_actions": sum(a.kind.value == "W" for a in schedule.ranks[rank])}
        for method, size in (("uniform", 2), ("block", 1)):
            config = model_config(hidden_dropout=DROPOUT, recompute_method=method,
                                  recompute_num_layers=size)
            result, grads, _ = _run(config, schedule, microbatches, groups)
            entry[method] = {
                "loss_equal": stored.loss_sum == result.loss_sum,
                "grads_equal": sorted(grads) == sorted(stored_grads) and all(
                    torch.equal(grads[k], stored_grads[k]) for k in grads),
                "drop": {f"{c},{m}": stored.activation_bytes[(c, m)] -
                         result.activation_bytes[(c, m)] for (c, m) in result.activation_bytes},
                "input_bytes": {f"{c},{m}": microbatches[m].tokens.numel() * hidden * 4
                                for (c, m) in result.activation_bytes},
                # the causal mask (bool [s, s]) every layer's attention saves, counted once
                "mask_bytes": {f"{c},{m}": microbatches[m].tokens.shape[1] ** 2
                               for (c, m) in result.activation_bytes},
                "peak": [stored.peak_activation_bytes, result.peak_activation_bytes],
                "held_for_w": max(result.wgrad_bytes.values(), default=0),
            }
        report[name] = entry
    with open(f"{out_path}.{rank}", "w") as handle:
        json.dump(report, handle)


@pytest.mark.multiproc
def test_full_recompute_equals_split_backward_for_every_family(tmp_path):
    run_workers(worker, 2, str(tmp_path / "full"), config=LaunchConfig(timeout_s=600))
    for rank in range(2):
        report = json.loads((tmp_path / f"full.{rank}").read_text())
        for name, entry in report.items():
            uniform, block = entry["uniform"], entry["block"]
            for method in (uniform, block):
                assert method["loss_equal"] and method["grads_equal"], (name, rank, method)
                assert method["peak"][1] < method["peak"][0], (name, rank, method["peak"])
                # B then W holds the deferred work's tensors; a fused BW holds none
                assert (method["held_for_w"] > 0) == (entry["w_actions"] > 0), (name, rank)
            for key, drop_one in block["drop"].items():
                chunk = int(key.split(",")[0])
                num_layers = entry["layers"][str(chunk)]
                kept = uniform["input_bytes"][key]
                layer = drop_one + kept  # one layer's saved bytes (block: one group of 1)
                groups = -(-num_layers // 2)
                # uniform, groups of 2: every layer's bytes, less one kept input per group,
                # and the shared mask (block keeps layers that still save it)
                expected = num_layers * layer - groups * kept + uniform["mask_bytes"][key]
                assert uniform["drop"][key] == expected, \
                    (name, rank, key, uniform["drop"][key], layer, kept)


def test_simulator_and_zb_auto_take_the_recompute_cost_in_t_b():
    from odc_pp.schedule.costs import CostModel
    from odc_pp.schedule.generators import generate
    from odc_pp.schedule.simulator import simulate
    from odc_pp.training.arguments import parse_args
    from odc_pp.training.components import recompute_costs

    base = ["--mock-data", "--vocab-size", "64", "--num-layers", "8",
            "--pipeline-model-parallel-size", "2"]
    costs = CostModel(t_f=2.0, t_b=3.0, t_w=1.0)

    def recomputed(extra):
        job = parse_args(base + extra).resolve(2)
        return recompute_costs(costs, job.args, 2, job.placement)

    assert recomputed([]) is costs
    uniform = recomputed(["--recompute-granularity", "full", "--recompute-method", "uniform",
                          "--recompute-num-layers", "2"])
    assert uniform.t_b == [5.0, 5.0] and uniform.t_w == 1.0  # every layer: + T_F
    block = recomputed(["--pipeline-schedule", "zbv", "--recompute-granularity", "full",
                        "--recompute-method", "block", "--recompute-num-layers", "1"])
    # zbv: 4 virtual stages of 2 layers; block recomputes 1 layer of each: + T_F / 2
    assert block.t_b == [4.0, 4.0, 4.0, 4.0]
    for name in ("zb-auto", "1f1b"):
        plain = simulate(generate(name, pp=2, num_microbatches=4, costs=costs), costs)
        recomputed = simulate(generate(name, pp=2, num_microbatches=4, costs=uniform),
                              uniform)
        # each rank does 4 x (F + B + W); B is 2 longer per microbatch
        assert recomputed.makespan >= 4 * (2.0 + 5.0 + 1.0)
        assert recomputed.makespan > plain.makespan


@pytest.mark.multiproc
@pytest.mark.slow
def test_pretrain_gpt_with_full_recompute_trains_like_without(tmp_path):
    """pretrain_gpt.py, pp=2 1f1b x dp=2 odc with the Megatron flags: the same losses as
    the run without recompute (bitwise; 1f1b's order does not depend on the costs, while
    zbv re-orders for the larger T_B and so sums gradients in another order); peak
    activations lower."""
    from odc_pp.testing.torchrun import TINY_MODEL, launch

    flags = TINY_MODEL + ["--pipeline-model-parallel-size", "2", "--pipeline-schedule",
                          "1f1b", "--train-iters", "3", "--log-activation-memory"]
    plain = launch(flags, nproc=4, tmp_path=tmp_path, name="plain")
    assert plain.returncode == 0, plain.describe()
    full = launch(flags + ["--recompute-granularity", "full", "--recompute-method",
                           "uniform", "--recompute-num-layers", "1"],
                  nproc=4, tmp_path=tmp_path, name="full")
    assert full.returncode == 0, full.describe()
    assert full.losses() == plain.losses()
    assert "--recompute-full" in full.stdout
    peaks = [run.records()[-1]["peak_activation_mb"] for run in (plain, full)]
    assert peaks[1] < peaks[0], peaks
