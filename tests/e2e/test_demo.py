"""``make demo``'s pieces that need no processes: the ratio arithmetic and that every
configuration it launches is a valid ``pretrain_gpt.py`` command line."""

from __future__ import annotations

import statistics

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


SIDES = [(name, label, flags) for name, sides in sorted(demo.COMPARISONS.items())
         for label, flags in [sides["ours"], *sides["bases"]]]


@pytest.mark.parametrize("name,label,flags", SIDES, ids=[f"{n}:{lab}" for n, lab, _ in SIDES])
def test_every_timed_configuration_parses(name, label, flags):
    args = parse_args(demo.SPEED_MODEL + flags + ["--train-iters", "3"])
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


def test_dp_is_measured_against_fsdp_style_and_megatron_ddp(monkeypatch, tmp_path, capsys):
    """(a) prints one line per baseline: the FSDP-style collective one and Megatron's own
    ddp (balanced and none); every side runs once per round and the order rotates."""
    monkeypatch.setattr(demo, "COMPARISONS", {"dp=2": demo.COMPARISONS["dp=2"]})
    step = {"odc": 1.0, "collective": 1.5, "ddp": 1.2}
    launched = []

    def fake_torchrun(flags, *, nproc, log, timeout_s):
        mode = flags[flags.index("--dp-mode") + 1]
        launched.append(mode + ":" + flags[flags.index("--load-balance") + 1])
        return [{"step_s": 9.0}] + [{"step_s": step[mode]}] * 2

    monkeypatch.setattr(demo, "_torchrun", fake_torchrun)
    results = demo.measure(str(tmp_path), rounds=2)
    lines = capsys.readouterr().out.splitlines()
    assert [c.base.split(" (")[0] for c in results] == [
        "collective + balanced", "ddp + balanced", "ddp + none"]
    assert [round(statistics.median(c.ratios), 2) for c in results] == [1.5, 1.2, 1.2]
    assert any("ODC + LB-Mini vs collective + balanced" in x and "1.50x" in x for x in lines)
    assert any("ODC + LB-Mini vs ddp + balanced" in x and "1.20x" in x for x in lines)
    assert any("ODC + LB-Mini vs ddp + none" in x for x in lines)
    assert launched[:4] == ["odc:lb-mini", "collective:balanced", "ddp:balanced", "ddp:none"]
    assert launched[4:] == ["collective:balanced", "ddp:balanced", "ddp:none", "odc:lb-mini"]
