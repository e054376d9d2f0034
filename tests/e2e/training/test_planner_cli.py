"""odc-pp plan (issue 22): --help works, the search is deterministic and always shows the
Megatron default, and the top configuration's printed flags run through pretrain_gpt.py
on CPU (tiny model, 2 ranks)."""

import json

import pytest

from odc_pp.cli import main as odc_pp_main
from odc_pp.testing.torchrun import launch

TINY = ("--num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 48 "
        "--vocab-size 48")
PLAN = ["plan", "--model-flags", TINY, "--gpus", "2", "--lengths-histogram",
        "16:60,32:30,48:10", "--global-batch", "8", "--cluster", "h100", "--top", "3"]


def test_plan_help_works(capsys):
    with pytest.raises(SystemExit) as stop:
        odc_pp_main(["plan", "--help"])
    assert stop.value.code == 0
    assert "--lengths-histogram" in capsys.readouterr().out


def test_plan_is_deterministic_and_shows_the_megatron_default(tmp_path, capsys):
    outputs = []
    for index in range(2):
        path = tmp_path / f"plan{index}.json"
        assert odc_pp_main(PLAN + ["--json", str(path)]) == 0
        outputs.append(json.loads(path.read_text()))
    assert outputs[0] == outputs[1]
    text = capsys.readouterr().out
    assert "flags of the Megatron default (M)" in text
    default = outputs[0]["megatron_default"]
    assert default["config"]["dp_mode"] == "ddp"
    assert default["config"]["schedule"] in ("1f1b", "interleaved")
    for pred in outputs[0]["predictions"]:
        parts = pred["breakdown"]
        assert sum(parts.values()) == pytest.approx(pred["step_s"], rel=1e-6)
        assert pred["tokens_per_s"] > 0 and 0 < pred["mfu"] < 1


def test_bad_input_names_the_flag(capsys):
    assert odc_pp_main(PLAN[:-6] + ["--lengths-histogram", "x", "--global-batch", "8"]) == 2
    assert "--lengths-histogram" in capsys.readouterr().err


@pytest.mark.multiproc
def test_top_configuration_runs_through_pretrain_gpt_with_the_printed_flags(tmp_path):
    path = tmp_path / "plan.json"
    assert odc_pp_main(PLAN + ["--json", str(path)]) == 0
    top = json.loads(path.read_text())["predictions"][0]
    c = top["config"]
    nproc = c["tp"] * c["pp"] * c["dp"]
    assert nproc == 2
    run = launch(top["flags"] + ["--mock-data", "--vocab-size", "48", "--train-iters", "2",
                                 "--lr", "1e-3", "--no-progress-bar", "--seed", "3",
                                 "--distributed-timeout-minutes", "1.5"],
                 nproc=nproc, tmp_path=tmp_path, name="planned")
    assert run.returncode == 0, run.describe()
    assert len(run.losses()) == 2


def test_printed_flags_keep_the_users_model_flags():
    """GQA, vocabulary and norm flags the planner does not model still reach the printed
    command, so the planned run trains the model the user described."""
    from odc_pp.plan_command import model_from_flags

    text = ("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --num-query-groups 2 "
            "--group-query-attention --vocab-size 96 --seq-length 128 "
            "--normalization RMSNorm")
    model = model_from_flags(text)
    assert model.model_flags() == text.split()
    assert model.vocab_size == 96


def test_every_column_has_a_legend_and_the_histogram_is_shown(capsys):
    """Issue 33: a legend for every column (rc, cap, ...) and how --lengths-histogram was
    read (each bin uniform from the previous length + 1: "48:100" means 1..48)."""
    argv = PLAN[:PLAN.index("--lengths-histogram")] + ["--lengths-histogram", "48:100"] + \
        PLAN[PLAN.index("--lengths-histogram") + 2:]
    assert odc_pp_main(argv) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "100 in 1..48" in out and "mean 2" in out  # ~24.5 for 1..48
    header = next(line for line in lines if line.lstrip().startswith("#"))
    legend = " ".join(line for line in lines if line.startswith(("columns:", "  ")) and
                      ":" in line and not line.lstrip().startswith(("1 ", "2 ", "M ")))
    columns = header.replace("step ms", "step_ms").replace("mem GB", "mem_GB").split()
    for column in columns:
        name = column.replace("_", " ")
        assert f"{name}:" in legend or (name == "#" and "# rank" in legend), (name, legend)


def test_printed_flags_name_the_dtype_and_vocabulary(tmp_path):
    path = tmp_path / "plan.json"
    assert odc_pp_main(PLAN + ["--json", str(path)]) == 0
    for pred in json.loads(path.read_text())["predictions"]:
        assert "--bf16" in pred["flags"] and "--vocab-size" in pred["flags"]


def test_baseline_is_the_users_layout(tmp_path, capsys):
    path = tmp_path / "plan.json"
    baseline = "--pipeline-model-parallel-size 2 --pipeline-schedule 1f1b"
    assert odc_pp_main(PLAN + ["--baseline", baseline, "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "predicted speed-up of #1 over B" in out
    row = json.loads(path.read_text())["baseline"]
    assert row["config"]["pp"] == 2 and row["config"]["tp"] == 1
    assert row["config"]["schedule"] == "1f1b" and row["config"]["dp_mode"] == "ddp"
    flags = row["flags"]
    assert flags[flags.index("--pipeline-model-parallel-size") + 1] == "2"
    assert odc_pp_main(PLAN + ["--baseline", "--tensor-model-parallel-size 3"]) == 2
    assert "--baseline" in capsys.readouterr().err


def test_packed_baselines_run_under_collective_and_ddp(tmp_path, capsys):
    """Issue 49: a packed --baseline is predicted under collective (lock step; a replica
    with fewer rows replays only their collectives) and ddp; one the trainer refuses
    names the flag to add."""
    for mode in ("collective", "ddp"):
        path = tmp_path / f"{mode}.json"
        flags = f"--dp-mode {mode} --pack-sequences --max-tokens-per-microbatch 96"
        assert odc_pp_main(PLAN + ["--baseline", flags, "--json", str(path)]) == 0
        row = json.loads(path.read_text())["baseline"]
        assert row["config"]["dp_mode"] == mode and row["config"]["packed"]
        assert row["config"]["token_cap"] == 96 and row["tokens_per_s"] > 0
    capsys.readouterr()
    refused = "--pack-sequences --load-balance lb-mini"  # ddp is the baseline's default
    assert odc_pp_main(PLAN + ["--baseline", refused]) == 2
    err = capsys.readouterr().err
    assert "--baseline" in err and "add --load-balance balanced" in err
