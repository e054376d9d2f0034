"""tools/gpu_check.py without a GPU: the stage list, stage selection (--quick), the JSON
record's assembly and merging, the --out directory (record + log tarball), the budget,
the process-tree kill on a timeout, the attention checks, the benchmark ratios, the loss
comparison and the output parsers."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load():
    spec = importlib.util.spec_from_file_location(
        "gpu_check", os.path.join(ROOT, "tools", "gpu_check.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses resolve annotations through it
    spec.loader.exec_module(module)
    return module


gpu_check = _load()

ROWS = [{"mib": 16.0, "gather_alone_vs_d2d": 0.5, "gather_vs_d2d": 0.4,
         "scatter_vs_local_add": 0.3},
        {"mib": 64.0, "gather_alone_vs_d2d": 0.8, "gather_vs_d2d": 0.6,
         "scatter_vs_local_add": 0.35},
        {"mib": 1024.0, "gather_alone_vs_d2d": 0.9, "gather_vs_d2d": 0.7,
         "scatter_vs_local_add": 0.4}]


def test_stages_cover_the_issue_in_order_and_fit_ten_minutes():
    assert gpu_check.stage_names() == [
        "attention", "hf-config", "setup", "build", "device-choice", "pytest-gpu",
        "bench-transport", "train-zbv-bf16", "train-zbv-bf16-packed", "train-1f1b-fp32",
        "train-pp2-nccl", "train-dp2-shared", "train-dp2-residency", "train-offload",
        "train-zb-auto", "step", "bench-tp"]
    assert all(stage.timeout_s <= 600 for stage in gpu_check.STAGES)
    with pytest.raises(ValueError, match="timeout_s"):
        gpu_check.Stage(name="x", summary="x", timeout_s=601, run=lambda context: [])


def test_stage_selection_keeps_pipeline_order_and_names_unknown_stages():
    assert [s.name for s in gpu_check.select_stages(None)] == gpu_check.stage_names()
    assert [s.name for s in gpu_check.select_stages(["all"])] == gpu_check.stage_names()
    picked = gpu_check.select_stages(["train-zb-auto", "build"])
    assert [s.name for s in picked] == ["build", "train-zb-auto"]
    with pytest.raises(ValueError, match="nope"):
        gpu_check.select_stages(["nope"])


def test_record_has_the_required_keys_and_ratios_from_64_mib():
    check = gpu_check.Check(name="build_extensions", passed=True, detail="devices 1")
    record = gpu_check.assemble_record(None, device="NVIDIA H100", date="2026-11-23",
                                       torch_version="2.11.0", megatron_core="0.16.1",
                                       checks=[check], bench={"rows": ROWS})
    assert set(record) == {"device", "date", "torch", "megatron_core", "checks",
                           "gather_vs_d2d", "scatter_vs_local_add"}
    assert record["checks"] == {"build_extensions": {"passed": True, "detail": "devices 1"}}
    assert [row["mib"] for row in record["gather_vs_d2d"]] == [64.0, 1024.0]
    assert [row["scatter_vs_local_add"] for row in record["scatter_vs_local_add"]] == \
        [0.3, 0.35, 0.4]


def test_later_stages_merge_into_the_record_of_the_same_machine_only():
    first = gpu_check.assemble_record(
        None, device="H100", date="d1", torch_version="2.11", megatron_core="0.16.1",
        checks=[gpu_check.Check(name="a", passed=True, detail="")], bench={"rows": ROWS})
    second = gpu_check.assemble_record(
        first, device="H100", date="d2", torch_version="2.11", megatron_core=None,
        checks=[gpu_check.Check(name="b", passed=False, detail="why"),
                gpu_check.Check(name="a", passed=False, detail="again")], bench=None)
    assert second["checks"] == {"a": {"passed": False, "detail": "again"},
                                "b": {"passed": False, "detail": "why"}}
    assert second["gather_vs_d2d"] == first["gather_vs_d2d"]
    assert second["megatron_core"] == "0.16.1" and second["date"] == "d2"
    other = gpu_check.assemble_record(
        first, device="H200", date="d3", torch_version="2.11", megatron_core=None,
        checks=[gpu_check.Check(name="c", passed=True, detail="")], bench=None)
    assert set(other["checks"]) == {"c"} and other["gather_vs_d2d"] is None


def test_loss_comparison():
    ok, detail = gpu_check.compare_losses([4.0, 3.5], [4.0002, 3.5001])
    assert ok, detail
    ok, detail = gpu_check.compare_losses([4.0, 3.5], [4.01, 3.5])
    assert not ok and "0.01" in detail
    assert not gpu_check.compare_losses([4.0], [4.0, 3.0])[0]
    assert not gpu_check.compare_losses([float("nan")], [float("nan")])[0]


def test_output_parsers():
    assert gpu_check.pytest_counts("..\n3 passed, 2 skipped, 1 failed in 2.0s\n") == \
        {"passed": 3, "skipped": 2, "failed": 1}
    assert gpu_check.pytest_counts("no summary") == {}
    line = ("zb-auto re-planned from measured costs (T_F/T_B/T_W ms per stage: "
            "7.48/7.76/3.89, 1.00/2.00/0.50; T_comm 0.00 ms): predicted ...")
    assert gpu_check.replan_costs(line) == [(7.48, 7.76, 3.89), (1.0, 2.0, 0.5)]
    assert gpu_check.replan_costs("nothing") is None


def test_shell_entry_point_lists_the_stages():
    done = subprocess.run(["bash", os.path.join(ROOT, "tools", "gpu_check.sh"), "--list"],
                          env=dict(os.environ, PYTHON=sys.executable), text=True,
                          capture_output=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    assert [line.split()[0] for line in done.stdout.splitlines()] == gpu_check.stage_names()


def test_refuses_to_run_without_a_cuda_device_unless_asked(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    out = tmp_path / "out"
    assert gpu_check.main(["--stage", "build", "--out", str(out),
                           "--log-dir", str(tmp_path)]) == 2
    assert not out.exists()


def test_quick_runs_the_issue_21_stages_in_order_within_one_call():
    args, stages = gpu_check._parse(["--quick"])
    assert [s.name for s in stages] == [
        "attention", "hf-config", "setup", "build", "device-choice", "train-zbv-bf16-packed",
        "train-pp2-nccl"]
    assert args.budget_s == gpu_check.QUICK_BUDGET_S <= 300
    with pytest.raises(SystemExit):
        gpu_check._parse(["--quick", "--stage", "build"])
    with pytest.raises(SystemExit):
        gpu_check._parse(["--out", "record.json"])  # --out is a directory


def test_out_directory_holds_the_record_and_one_log_tarball(tmp_path):
    import tarfile

    logs = tmp_path / "logs"
    logs.mkdir()
    for name in ("build.log", "attention.log", "packed_attention.json"):
        (logs / name).write_text(name)
    record = gpu_check.assemble_record(
        None, device="H200", date="d", torch_version="2.11", megatron_core="0.16.1",
        checks=[gpu_check.Check(name="a", passed=True, detail="")], bench=None)
    out = tmp_path / "out"
    gpu_check.write_outputs(str(out), record, str(logs))
    assert sorted(os.listdir(out)) == ["gpu_check.json", "gpu_check_logs.tar.gz"]
    with tarfile.open(out / "gpu_check_logs.tar.gz") as tar:
        assert sorted(tar.getnames()) == ["attention.log", "build.log",
                                          "packed_attention.json"]


def test_a_spent_budget_records_named_not_run_checks(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "_environment", lambda python: {
        "device": "NVIDIA H200", "torch": "2.11.0+cu130", "megatron_core": "0.16.1"})
    out = tmp_path / "out"
    status = gpu_check.main(["--quick", "--budget-s", "0", "--allow-cpu", "--out", str(out),
                             "--log-dir", str(tmp_path / "logs")])
    import json

    record = json.loads((out / "gpu_check.json").read_text())
    assert status == 1
    assert set(record["checks"]) == {name.replace("-", "_") + "_not_run"
                                     for name in gpu_check.QUICK_STAGES}


def test_a_timeout_kills_the_whole_process_tree(tmp_path):
    import time

    context = gpu_check.Context(python=sys.executable, root=ROOT, log_dir=str(tmp_path))
    marker = tmp_path / "late"
    started = time.monotonic()
    status, output = gpu_check.run_command(
        context, "tree", ["bash", "-c", f"(sleep 1.5; touch {marker}) & echo started; wait"],
        timeout_s=0.5)
    assert status == 124 and "started" in output and time.monotonic() - started < 1.5
    time.sleep(2)
    assert not marker.exists(), "the grandchild outlived the timeout"


def test_attention_checks_name_the_kernels_and_bounds():
    result = {"varlen_backend": "torch.varlen_attn+repeat_kv", "auto_kernel_bf16": "varlen",
              "auto_kernel_fp32": "flex", "passed": False,
              "parity": [{"kernel": "old-dense", "dtype": "bfloat16", "error": 4e-3,
                          "passed": True},
                         {"kernel": "varlen", "dtype": "bfloat16", "error": 5e-3,
                          "bound": 9e-3, "passed": True},
                         {"kernel": "flex", "dtype": "bfloat16", "error": None,
                          "passed": False, "failure": "RuntimeError('x')"}],
              "timing": [{"kernel": "old-dense", "fwd_bwd_ms": 9.5},
                         {"kernel": "varlen", "fwd_bwd_ms": 2.25}]}
    parity, timing = gpu_check.attention_checks(result)
    assert not parity.passed and "varlen bfloat16 5.00e-03 (<= 9.00e-03)" in parity.detail
    assert "flex bfloat16 FAILED" in parity.detail and "auto picks varlen" in parity.detail
    assert timing.passed and "varlen 2.25 ms" in timing.detail
    result["timing"] = result["timing"][:1]
    assert not gpu_check.attention_checks(result)[1].passed


def test_residency_stage_compares_layer_with_minibatch_step_time_and_losses():
    import gpu_check_residency as residency

    def records(steps, losses):
        return [{"step_s": s, "loss": loss} for s, loss in zip(steps, losses)]
    losses = [5.0, 4.5, 4.2, 4.0]
    fast = records([9.0, 3.0, 1.0, 1.0], losses)  # warm-up steps left out of the median
    checks = {c.name: c for c in residency.residency_checks(
        fast, records([1.0, 1.0, 1.05, 1.08], losses))}
    assert checks["residency_layer_step_time"].passed
    assert '"layer_over_minibatch": 1.065' in checks["residency_layer_step_time"].detail
    assert checks["residency_layer_losses_equal"].passed
    assert "bitwise equal: True" in checks["residency_layer_losses_equal"].detail
    checks = {c.name: c for c in residency.residency_checks(
        fast, records([1.0, 1.0, 1.3, 1.3], [5.0, 4.5, 4.3, 4.0]))}
    assert not checks["residency_layer_step_time"].passed
    assert not checks["residency_layer_losses_equal"].passed
    assert not residency.residency_checks(fast, [])[0].passed
