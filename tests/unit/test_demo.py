"""``make demo``'s pieces that need no processes: the ratio arithmetic and that every
configuration it launches is a valid ``pretrain_gpt.py`` command line."""

from __future__ import annotations

import pytest

from odc_pp import demo
from odc_pp.training.arguments import parse_args


def test_ratios_are_baseline_over_ours_per_round():
    c = demo.Comparison(name="dp=2", ours="a", base="b", ours_s=[1.0, 2.0, 4.0],
                        base_s=[1.5, 2.0, 2.0], load=[0.1, 0.2, 0.3])
    assert c.ratios == [1.5, 1.0, 0.5]
    line = c.line()
    assert "1.00x faster" in line and "min 0.50, max 1.50" in line and "BUSY" not in line


def test_a_busy_machine_is_flagged(monkeypatch):
    monkeypatch.setattr(demo.os, "cpu_count", lambda: 2)
    c = demo.Comparison(name="pp=2", ours="a", base="b", ours_s=[1.0], base_s=[1.0],
                        load=[3.5])
    assert "BUSY MACHINE" in c.line()


@pytest.mark.parametrize("name", sorted(demo.COMPARISONS))
@pytest.mark.parametrize("side", ["ours", "base"])
def test_every_timed_configuration_parses(name, side):
    args = parse_args(demo.SPEED_MODEL + demo.COMPARISONS[name][side][1] +
                      ["--train-iters", "3"])
    assert args.model.hidden_size == 256


@pytest.mark.slow
def test_the_plans_megatron_row_is_ddp_and_its_flags_dry_run(tmp_path, capsys):
    """Issue 49: part (c)'s row M is Megatron as its users run it (``--dp-mode ddp``:
    DDP with the distributed optimizer), and its printed flags are a job the dry run
    accepts (exit 0: fits, 1: does not; 2 would be flags it refuses)."""
    import json

    from odc_pp.plan_command import main as plan_main
    from odc_pp.training import dry_run

    path = tmp_path / "plan.json"
    assert plan_main(demo.plan_arguments(str(path)) + ["--jobs", "1"]) == 0
    default = json.loads(path.read_text())["megatron_default"]
    assert default["config"]["dp_mode"] == "ddp" and default["config"]["balance"] == "none"
    flags = default["flags"]
    assert flags[flags.index("--dp-mode") + 1] == "ddp"
    capsys.readouterr()
    code = dry_run.main(flags + ["--mock-data", "--dry-run", "--dry-run-world-size",
                                 str(demo.PLAN_GPUS), "--memory-gb", "80"])
    assert code in (0, 1), capsys.readouterr().err
    assert "dry run: error" not in capsys.readouterr().err
