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
