"""`odc-pp schedule` CLI: JSON fields, compare table, renders, bad input exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from odc_pp.schedule import CostModel
from odc_pp.schedule.cli import main
from odc_pp.schedule.simulator import simulate
from odc_pp.schedule.ir import Schedule, Action

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def test_json_has_the_documented_fields_and_consistent_numbers(capsys):
    code = main(["--schedule", "zb-auto", "--pp", "4", "--microbatches", "8",
                 "--cost-f", "1.5,1,1,1.5", "--cost-b", "1", "--cost-w", "0.6",
                 "--memory-limit", "8", "--json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    for key in ("schedule", "pp", "microbatches", "chunks", "makespan", "bubble_rate",
                "peak_activation", "search_seconds", "actions"):
        assert key in data, key
    assert data["schedule"] == "zb-auto" and data["pp"] == 4 and data["chunks"] == 1
    assert len(data["peak_activation"]) == 4 and max(data["peak_activation"]) <= 8
    assert len(data["actions"]) == 4 * 8 * 3
    # the reported makespan is the simulation of the reported actions
    schedule = Schedule(name="x", pp=4, num_microbatches=8)
    schedule.extend(Action.from_dict(a) for a in data["actions"])
    costs = CostModel(t_f=[1.5, 1, 1, 1.5], t_b=1, t_w=0.6)
    assert simulate(schedule, costs).makespan == pytest.approx(data["makespan"])


def test_compare_lists_every_family(capsys):
    from odc_pp.schedule.compare import family_names
    code = main(["--pp", "4", "--microbatches", "8", "--cost-w", "0.6", "--compare"])
    assert code == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("schedule")
    for name in family_names():
        assert any(line.startswith(name + " ") for line in out.splitlines()), name
    assert main(["--pp", "4", "--microbatches", "8", "--compare", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [row["name"] for row in rows] == family_names()


@pytest.mark.parametrize("argv", [
    ["--pp", "0", "--microbatches", "4"],
    ["--pp", "4", "--microbatches", "x"],
    ["--pp", "4", "--microbatches", "4", "--cost-f", "1,2,3"],
    ["--pp", "4", "--microbatches", "4", "--schedule", "no-such-schedule"],
    ["--pp", "4", "--microbatches", "4", "--memory-limit", "0.5"],
    ["--pp", "4", "--microbatches", "4", "--render", "png"],
    ["--pp", "4", "--microbatches", "4", "--cost-comm", "-1"],
    ["--pp", "2", "--microbatches", "4", "--schedule", "offload", "--fill-gaps", "10"],
])
def test_bad_input_exits_2_without_traceback(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err


def test_renders_to_files(tmp_path, capsys):
    svg = tmp_path / "s.svg"
    png = tmp_path / "s.png"
    assert main(["--pp", "3", "--microbatches", "3", "--render", "svg", "--output",
                 str(svg)]) == 0
    assert svg.read_text().lstrip().startswith("<svg")
    assert main(["--pp", "3", "--microbatches", "3", "--render", "png", "--output",
                 str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    capsys.readouterr()
    assert main(["--pp", "3", "--microbatches", "3", "--render", "ascii"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [row[:2] for row in lines[1:-1]] == ["r0", "r1", "r2"]
    assert "makespan" in lines[0] and lines[-1].startswith("legend: ")


def test_console_entry_and_tool_wrapper_run_as_subprocesses():
    env = dict(os.environ, PYTHONPATH=ROOT)
    for cmd in ([sys.executable, "-m", "odc_pp.cli", "schedule"],
                [sys.executable, os.path.join(ROOT, "tools", "schedule_search.py")]):
        proc = subprocess.run(cmd + ["--pp", "2", "--microbatches", "2", "--json"],
                              capture_output=True, text=True, timeout=120, env=env)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["pp"] == 2
        bad = subprocess.run(cmd + ["--pp", "-3", "--microbatches", "2"],
                             capture_output=True, text=True, timeout=120, env=env)
        assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_compare_rows_and_rejections():
    from odc_pp.schedule.compare import compare_schedules, format_table
    costs = CostModel(t_f=1, t_b=1, t_w=0.6)
    rows = compare_schedules(4, 4, costs, names=["1f1b", "zb-auto", "dualpipev"])
    by_name = {row["name"]: row for row in rows}
    # dualpipev needs m >= 2p: listed with its reason, not dropped
    assert "error" in by_name["dualpipev"] and "microbatch" in by_name["dualpipev"]["error"]
    for name in ("1f1b", "zb-auto"):
        row = by_name[name]
        assert row["chunks"] == 1 and len(row["peak_activation"]) == 4
        assert row["makespan"] > 0 and 0 <= row["bubble_rate"] < 1
    # 1F1B closed form with fused backward: (m + p - 1) * (F + B + W)
    assert by_name["1f1b"]["makespan"] == pytest.approx((4 + 3) * 2.6)
    assert by_name["zb-auto"]["makespan"] <= by_name["1f1b"]["makespan"]
    table = format_table(rows)
    # header, rule, rows, legend (makespan and bubble, span, memory units)
    assert "rejected" in table and len(table.splitlines()) == 2 + 3 + 3


@pytest.mark.parametrize("flag,value", [("--cost-f", "inf"), ("--cost-f", "nan"),
                                        ("--cost-b", "1,-1,1,1"), ("--cost-w", "-0.5"),
                                        ("--cost-f", "1,inf,1,1")])
def test_non_finite_or_negative_cost_is_one_error_naming_the_flag(flag, value, capsys):
    assert main(["--pp", "4", "--microbatches", "8", "--schedule", "1f1b",
                 flag, value]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no makespan line
    assert f"argument {flag}: '{value}': times must be finite numbers in [0, 1e+12]" in \
        captured.err
    assert captured.err.count("error:") == 1 and "memory_limit" not in captured.err


@pytest.mark.parametrize("flag,value,expected", [
    ("--cost-comm", "nan", "argument --cost-comm: must be a finite number in [0, 1e+12]"),
    ("--memory-limit", "nan", "argument --memory-limit: must be a finite number in (0, 1e+09]"),
    ("--offload-bandwidth", "inf",
     "argument --offload-bandwidth: must be a finite number in (0, 1e+12]"),
])
def test_non_finite_setting_is_one_error_naming_the_flag(flag, value, expected, capsys):
    assert main(["--pp", "4", "--microbatches", "8", flag, value]) == 2
    assert expected in capsys.readouterr().err


def test_cost_model_rejects_non_finite_values():
    for bad in (dict(t_f=float("inf")), dict(t_b=[1, float("nan")]),
                dict(t_comm=float("nan")), dict(offload_bandwidth=float("inf"))):
        with pytest.raises(ValueError, match="finite"):
            CostModel(**bad)


def test_objective_memory_deltas_and_digest_in_json(capsys):
    base = ["--schedule", "zb-auto", "--pp", "4", "--microbatches", "8", "--json",
            "--max-evaluations", "40"]
    assert main(base) == 0
    span = json.loads(capsys.readouterr().out)
    assert span["objective"] == "span" and span["bubble_rate"] == pytest.approx(0.0)
    assert span["max_stage_span"] == pytest.approx(max(span["span"]))
    assert span["memory_deltas"] == {"F": 1.0, "B": 0.0, "W": -1.0}
    assert main(base + ["--objective", "makespan"]) == 0
    makespan = json.loads(capsys.readouterr().out)
    assert makespan["objective"] == "makespan"
    assert makespan["makespan"] <= span["makespan"] + 1e-9
    # the paper's memory model: B frees what W does not need
    assert main(base + ["--mem-b", "-0.6", "--mem-w", "-0.4", "--memory-limit", "4"]) == 0
    paper = json.loads(capsys.readouterr().out)
    assert paper["memory_deltas"] == {"F": 1.0, "B": -0.6, "W": -0.4}
    assert max(paper["peak_activation"]) <= 4 + 1e-9
    assert main(base) == 0  # same input, same schedule
    assert json.loads(capsys.readouterr().out)["digest"] == span["digest"]


def test_memory_deltas_must_sum_to_zero(capsys):
    assert main(["--pp", "2", "--microbatches", "4", "--mem-b", "-0.5"]) == 2
    assert "sum to zero" in capsys.readouterr().err


def test_v_schedule_takes_any_memory_limit_and_rejects_one_below_the_minimum(capsys):
    for limit in ("3", "7.5", "12"):
        assert main(["--schedule", "v-min", "--pp", "4", "--microbatches", "8",
                     "--memory-limit", limit, "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["fits_memory"] and max(data["peak_activation"]) <= float(limit)
    assert main(["--schedule", "v-half", "--pp", "4", "--microbatches", "8",
                 "--memory-limit", "1.5"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("error:") == 1
    assert "--memory-limit" in captured.err and "at least 2" in captured.err


def test_fill_gaps_shortens_1f1b_under_unequal_costs(capsys):
    argv = ["--schedule", "1f1b", "--pp", "4", "--microbatches", "8", "--cost-f",
            "1,1,1,1.05", "--cost-b", "1.7,1.7,1.7,1.79", "--cost-w", "0.27",
            "--mem-b", "-0.667", "--mem-w", "-0.333", "--json"]
    assert main(argv) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(argv + ["--fill-gaps", "500"]) == 0
    filled = json.loads(capsys.readouterr().out)
    assert plain["gap_fill"] is None and filled["gap_fill"]["moves"] > 0
    assert filled["makespan"] < plain["makespan"] * 0.99
    assert max(filled["peak_activation"]) <= max(plain["peak_activation"]) + 1e-9


def _table_rows(text: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split() for line in text.splitlines()[2:]
            if line and not line.startswith(("-", "makespan:", "span:", "peak mem:"))
            and "rejected" not in line}


def test_compare_bubble_follows_each_schedules_makespan(capsys):
    """The bubble column is each schedule's idle share of its own makespan, so schedules
    with different makespans never show the same bubble (zb-h2 at 27 and zbv at 25.5 both
    showed 0.00%: the bubble of a per-stage span the table did not print)."""
    assert main(["--pp", "4", "--microbatches", "8", "--compare"]) == 0
    text = capsys.readouterr().out
    header = text.splitlines()[0].split()
    assert header[:6] == ["schedule", "chunks", "makespan", "bubble", "span", "span"]
    rows = _table_rows(text)
    assert {"zb-h2", "zbv", "1f1b"} <= set(rows)
    pairs = [(float(r[2]), float(r[3].rstrip("%"))) for r in rows.values()]
    for makespan, bubble in pairs:
        for other_makespan, other_bubble in pairs:
            if makespan < other_makespan:
                assert bubble < other_bubble, text
    assert "bubble: the busiest rank's idle share of the makespan" in text
    assert main(["--pp", "4", "--microbatches", "8", "--compare", "--json"]) == 0
    for row in json.loads(capsys.readouterr().out)["rows"]:
        if "error" not in row:
            busy = row["makespan"] * (1 - row["makespan_bubble_rate"])
            assert busy == pytest.approx(8 * 3.0), row["name"]  # m x (F + B + W) per rank


def test_ascii_render_has_title_and_legend(capsys):
    assert main(["--schedule", "zbv", "--pp", "4", "--microbatches", "8", "--render",
                 "ascii", "--width", "60"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == ("zbv: pp=4 microbatches=8 chunks=2 | makespan 51 | bubble 5.88% of "
                        "the makespan | span 48, bubble 0.00% of the span")
    assert [line[:3] for line in lines[1:5]] == ["r0 ", "r1 ", "r2 ", "r3 "]
    assert lines[5] == ("legend: F forward, B input grad, W weight grad, X fused B+W (upper "
                        "case: even chunks, lower case: odd chunks), . idle; one column = "
                        "0.85 time units")


def test_offload_refusal_names_the_flag(capsys):
    assert main(["--schedule", "offload", "--pp", "4", "--microbatches", "8"]) == 2
    err = capsys.readouterr().err
    assert "--offload-bandwidth" in err and "CostModel" not in err, err
    assert main(["--pp", "4", "--microbatches", "8", "--compare"]) == 0
    offload = next(line for line in capsys.readouterr().out.splitlines()
                   if line.startswith("offload "))
    assert "rejected" in offload and "--offload-bandwidth" in offload
    assert "CostModel" not in offload, offload


@pytest.mark.parametrize("argv,named", [
    (["--schedule", "dualpipev", "--pp", "4", "--microbatches", "4"], "--microbatches >= 2"),
    (["--schedule", "zbv", "--pp", "4", "--microbatches", "8", "--memory-limit", "1"],
     "--memory-limit 1 is below 2"),
    (["--schedule", "v-min", "--pp", "4", "--microbatches", "8", "--chunks", "3"],
     "got --chunks=3"),
    (["--pp", "4", "--microbatches", "8", "--mem-f", "2"], "(--mem-f + --mem-b + --mem-w"),
    (["--pp", "4", "--microbatches", "8", "--cost-f", "1,1"], "--cost-f has 2 entries"),
])
def test_refusals_name_this_commands_flags(argv, named, capsys):
    """The schedule library's refusals (its field names are shared with training) reach
    the user in odc-pp schedule's own flags."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert named in err, err
    for field in ("num_microbatches", "num_chunks", "memory_limit", "mem_f", "t_f"):
        assert field not in err, err
