import json

import pytest

from odc_pp.schedule.costs import CostModel
from odc_pp.schedule.ir import ActionKind
from odc_pp.schedule.lowering import lower_communication
from odc_pp.schedule.offload_tuner import (PRESETS, ModelShape, TunerConfig,
                                           candidate_schedule, estimate_costs,
                                           layer_activation_bytes, main, tune)
from odc_pp.schedule.simulator import simulate

SHAPE = ["--num-layers", "32", "--hidden-size", "4096", "--num-attention-heads", "32",
         "--seq-length", "8192", "--pp", "4", "--num-microbatches", "8"]


def test_activation_formula_closed_form():
    shape = ModelShape(num_layers=1, hidden_size=1024, num_attention_heads=16, seq_length=2048,
                       micro_batch_size=2, flash_attention=False)
    s, b, h, a = 2048, 2, 1024, 16
    assert layer_activation_bytes(shape, recompute=False) == s * b * h * (34 + 5 * a * s / h)
    flash = ModelShape(num_layers=1, hidden_size=1024, num_attention_heads=16, seq_length=2048,
                       micro_batch_size=2)
    assert layer_activation_bytes(flash, recompute=True) == s * b * h * 20


def _frontend(flags: list[str], *, dp: int):
    """What pretrain_gpt.py does with ``flags``: its parsed arguments, the per-replica
    microbatch count on pp x dp ranks, and the schedule its components build."""
    from odc_pp.training.arguments import parse_args
    from odc_pp.training.components import build_schedule, load_cost_model

    args = parse_args(flags + ["--mock-data", "--vocab-size", "32000"])
    pp = args.parallel.pipeline_model_parallel_size
    replicas = args.data_parallel_size(pp * dp)
    num_microbatches = args.data.global_batch_size // (args.data.micro_batch_size * replicas)
    schedule = build_schedule(args.schedule, pp=pp, num_microbatches=num_microbatches,
                              costs=load_cost_model(args.schedule))
    return args, num_microbatches, schedule


def _config(preset: str, budget: float, **extra) -> TunerConfig:
    return TunerConfig(shape=ModelShape(num_layers=32, hidden_size=4096,
                                        num_attention_heads=32, seq_length=8192),
                       hardware=PRESETS[preset], pp=4, num_microbatches=8,
                       memory_budget_gb=budget, **extra)


@pytest.mark.parametrize("preset,budget,plan_costs", [
    ("h100", 60, None),
    ("a100", 45, CostModel(t_f=1.0, t_b=1.4, t_w=0.6, offload_bandwidth=0.5)),
])
def test_recommended_flags_build_the_simulated_schedule(preset, budget, plan_costs,
                                                        tmp_path, capsys):
    """Every ranked candidate's printed flags, parsed by the training frontend, build the
    schedule the tuner simulated (same actions) and so the step time it reported."""
    argv = SHAPE + ["--preset", preset, "--memory-budget-gb", str(budget), "--json",
                    "--top", "100"]
    extra = {}
    if plan_costs is not None:
        path = tmp_path / "costs.json"
        path.write_text(json.dumps(plan_costs.to_dict()))
        argv += ["--cost-model", str(path)]
        extra = dict(plan_costs=plan_costs, plan_costs_path=str(path))
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["fits"]
    config = _config(preset, budget, **extra)
    assert any(r["offload_chunks"] for r in rows) and any(r["recompute"] for r in rows)
    assert any(r["schedule"] in ("v-half", "v-min", "zbv") for r in rows)
    for row in rows:
        args, num_microbatches, built = _frontend(row["flags"], dp=config.dp)
        assert (args.schedule.pipeline_schedule, args.schedule.num_model_chunks, args.model.recompute_lgd) == (
            row["schedule"], row["num_chunks"], row["recompute"])
        assert tuple(args.schedule.offload_chunks or ()) == tuple(row["offload_chunks"])
        assert num_microbatches == config.num_microbatches
        simulated = candidate_schedule(config, row["schedule"],
                                       offload_chunks=tuple(row["offload_chunks"]))
        # the frontend runs it with explicit communication (same compute order)
        assert built.ranks == lower_communication(simulated).ranks, row["flags"]
        if row["offload_chunks"]:
            offloaded = {a.chunk for a in built.actions() if a.kind is ActionKind.OFFLOAD}
            assert offloaded == set(row["offload_chunks"])
        costs, _, _ = estimate_costs(config, row["schedule"], recompute=row["recompute"])
        assert simulate(built, costs).makespan == pytest.approx(row["step_s"], rel=1e-12)


def test_printed_best_line_is_the_top_candidate(capsys):
    assert main(SHAPE + ["--preset", "h100", "--memory-budget-gb", "60"]) == 0
    out = capsys.readouterr().out
    best_line = next(line for line in out.splitlines() if line.startswith("best: "))
    best = tune(_config("h100", 60))[0]
    assert best_line.split() == ["best:"] + best.flags


@pytest.mark.parametrize("preset", ["a100", "h100", "h200"])
def test_presets_print_a_ranked_table_whose_top_choice_fits(preset, capsys):
    assert main(SHAPE + ["--preset", preset, "--memory-budget-gb", "60"]) == 0
    out = capsys.readouterr().out
    assert "step (ms)" in out and "best: --pipeline-schedule" in out
    config = _config(preset, 60)
    ranking = tune(config)
    best = ranking[0]
    assert best.fits and best.peak_memory_gb <= 60
    fitting = [c for c in ranking if c.fits]
    assert [c.step_s for c in fitting] == sorted(c.step_s for c in fitting)
    # re-check the top choice independently: the frontend's schedule in the simulator
    args, _, schedule = _frontend(best.flags, dp=1)
    costs, chunk_bytes, static = estimate_costs(config, args.schedule.pipeline_schedule,
                                                recompute=args.model.recompute_lgd)
    sim = simulate(schedule, costs)
    peak = max(s + p * chunk_bytes for s, p in zip(static, sim.peak_activation))
    assert peak <= 60e9 and sim.makespan == pytest.approx(best.step_s)


def test_tight_budget_trades_speed_for_memory(capsys):
    assert main(SHAPE + ["--preset", "h100", "--memory-budget-gb", "80", "--json"]) == 0
    loose = json.loads(capsys.readouterr().out)[0]
    assert main(SHAPE + ["--preset", "h100", "--memory-budget-gb", "45", "--json"]) == 0
    tight = json.loads(capsys.readouterr().out)[0]
    assert loose["fits"] and tight["fits"] and tight["peak_memory_gb"] <= 45
    assert loose["peak_memory_gb"] > 45 and tight["step_s"] > loose["step_s"]


def test_infeasible_budget_is_a_clear_error(capsys):
    assert main(SHAPE + ["--preset", "a100", "--memory-budget-gb", "2"]) == 2
    err = capsys.readouterr().err
    assert "no schedule fits 2.0 GB" in err and "--memory-budget-gb" in err


def test_bad_input_is_a_clear_error(capsys):
    assert main(SHAPE[:-2] + ["--num-microbatches", "2", "--preset", "h100"]) == 2
    assert "--num-microbatches 2 must be >= --pp 4" in capsys.readouterr().err
    assert main(SHAPE) == 2
    assert "--preset" in capsys.readouterr().err


@pytest.mark.parametrize("budget", ["nan", "inf", "-1", "0"])
def test_non_finite_or_non_positive_budget_names_the_flag(budget, capsys):
    with pytest.raises(SystemExit) as info:
        main(SHAPE + ["--preset", "h100", "--memory-budget-gb", budget])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --memory-budget-gb: must be a finite number > 0" in err, err
    with pytest.raises(ValueError, match="--memory-budget-gb must be a finite number > 0"):
        _config("h100", float(budget))
