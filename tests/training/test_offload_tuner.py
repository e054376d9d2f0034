import json

import pytest

from odc_pp.schedule.costs import CostModel
from odc_pp.schedule.ir import ActionKind
from odc_pp.schedule.offload_tuner import (PRESETS, ModelShape, TunerConfig, add_offload,
                                           estimate_costs, layer_activation_bytes, main, tune)

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


def test_add_offload_pairs_every_offload_with_a_reload_before_its_backward():
    from odc_pp.schedule.generators import generate
    from odc_pp.schedule.simulator import simulate

    costs = CostModel(t_f=1, t_b=1, t_w=1, offload_bandwidth=2.0)
    base = generate("zbv", pp=4, num_microbatches=8, num_chunks=2, costs=costs)
    half = add_offload(base, (0,), 0.5)
    for rank in half.ranks:
        kinds = [(a.kind, a.chunk, a.microbatch) for a in rank]
        offloads = [k for k in kinds if k[0] is ActionKind.OFFLOAD]
        assert 3 <= len(offloads) <= 4 and all(c == 0 for _, c, _ in offloads)
        for _, chunk, mb in offloads:
            reload = kinds.index((ActionKind.RELOAD, chunk, mb))
            backward = next(i for i, k in enumerate(kinds) if k[1:] == (chunk, mb)
                            and k[0] in (ActionKind.B, ActionKind.BW))
            assert kinds.index((ActionKind.F, chunk, mb)) < kinds.index(
                (ActionKind.OFFLOAD, chunk, mb)) < reload < backward
    plain, offloaded = simulate(base, costs), simulate(add_offload(base, (0, 1), 1.0), costs)
    assert max(offloaded.peak_activation) < max(plain.peak_activation)


@pytest.mark.parametrize("preset", ["a100", "h100", "h200"])
def test_presets_print_a_ranked_table_whose_top_choice_fits(preset, capsys):
    assert main(SHAPE + ["--preset", preset, "--memory-budget-gb", "60"]) == 0
    out = capsys.readouterr().out
    assert "step (ms)" in out and "best: --pipeline-schedule" in out
    config = TunerConfig(shape=ModelShape(num_layers=32, hidden_size=4096,
                                          num_attention_heads=32, seq_length=8192),
                         hardware=PRESETS[preset], pp=4, num_microbatches=8,
                         memory_budget_gb=60)
    ranking = tune(config)
    best = ranking[0]
    assert best.fits and best.peak_memory_gb <= 60
    fitting = [c for c in ranking if c.fits]
    assert [c.step_s for c in fitting] == sorted(c.step_s for c in fitting)
    # re-check the top choice independently in the simulator
    from odc_pp.schedule.generators import generate
    from odc_pp.schedule.simulator import simulate

    costs, chunk_bytes, static = estimate_costs(config, best.schedule, recompute=best.recompute)
    schedule = generate(best.schedule, pp=4, num_microbatches=8,
                        num_chunks=2 if best.schedule in ("zbv", "v-half", "v-min",
                                                          "interleaved") else 1, costs=costs)
    if best.offload_ratio:
        schedule = add_offload(schedule, best.offload_chunks, best.offload_ratio)
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
