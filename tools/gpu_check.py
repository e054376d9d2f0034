#!/usr/bin/env python3
"""One-command GPU validation of odc-pp (issue 11, item 8; issue 21, item 5); ``tools/gpu_check.sh`` runs it.

Target machine: one H100 or H200, Python 3.12, torch with CUDA, nvcc, no network;
megatron-core, when not installed, comes from the cp312 wheel carried in ``.whl/``
(``pip install --no-index --find-links .whl``). docs/gpu.md gives the carry list and the
command lines for the lent machine.

Stages, in order (each fits the 10-minute limit of one command; ``--stage NAME`` runs one,
``--list`` prints them, ``--quick`` runs :data:`QUICK_STAGES` within ``QUICK_BUDGET_S``):

* ``setup``: megatron-core importable (installed from ``.whl/`` when missing).
* ``build``: both extensions (``odc_pp._C`` and ``odc_pp._C_cuda``) built in place, for
  the device's own architecture unless ``ODC_PP_CUDA_ARCHS`` is set (``90`` on H100/H200:
  one SASS target instead of four); the CUDA one sees a device.
* ``attention``: ``benchmarks/bench_packed_attention.py``: the packed-sequence kernels
  (varlen flash, FlexAttention, dense) against the pre-issue-21 dense-mask path in bf16
  (output and gradients), the kernel ``auto`` picks, CUDA-event fwd+bwd timings.
* ``hf-config``: ``tests/unit/models/test_hf_config.py`` under the installed transformers (a
  config saved by transformers >= 5 has ``rope_parameters``).
* ``device-choice``: a training run as rank ``LOCAL_RANK=1`` of a host where the process
  sees one GPU (SLURM ``--gpus-per-task=1``, Kubernetes).
* ``pytest-gpu``: ``pytest -m gpu`` (the CUDA IPC transport, offload with reserved-memory
  accounting, CUDA-event timings, the CUDA RNG state in checkpoints, ...).
* ``bench-transport``: ``benchmarks/bench_transport_gpu.py`` (gather vs device-to-device
  copy, scatter-accumulate vs a local add; 2 processes sharing the GPU).
* ``train-zbv-bf16``: ``pretrain_gpt.py`` with ZB-V, bf16 and optimizer post-validation.
* ``train-zbv-bf16-packed``: ZB-V, bf16, a Llama-shaped model (RoPE, SwiGLU, GQA) on
  packed sequences (the packed attention kernels inside training).
* ``train-1f1b-fp32``: 1F1B in fp32 on the GPU and the same run on CPU; losses agree to
  ``LOSS_RTOL`` / ``LOSS_ATOL``.
* ``train-pp2-nccl``: pp=2 over NCCL (1F1B and ZB-V, bf16, packed) with two GPUs; on one
  it records ``train_pp2_nccl_skipped`` (NCCL refuses two ranks on one GPU).
* ``train-dp2-shared``: dp=2 with ODC over CUDA IPC and LB-Mini packed rows, both ranks on
  one GPU (gloo for the collectives), losses equal to the same flags on CPU.
* ``train-dp2-residency``: the same dp=2 on one GPU with ``--odc-param-residency layer``
  vs ``minibatch``: step time within 1.1x, equal losses (``tools/gpu_check_residency.py``).
* ``train-offload``: the offload schedule (``--cpu-offload``); the log's peak memory is the
  caching allocator's peak *reservation*.
* ``train-zb-auto``: ZB-auto re-planned from measured costs (CUDA-event action timings).
* ``step``: ``benchmarks/bench_gpu_step.py`` (issue 29): the Llama-3-8B-shaped step, full
  rows (1f1b, zbv), the lb-mini packed path, unpacked rows and the Hugging Face baseline,
  with the dry run's prediction; a check per run and per target.
* ``bench-tp``: the GPU rows of ``benchmarks/bench_tp.py`` (tp=2 vs pp=2 vs pp=2 + offload,
  ``benchmarks/results/tp_gpu.json``); needs two GPUs, so on one it records ``bench_tp_gpu_skipped``.

Output: ``--out DIR`` (default ``out/gpu_check``) receives two files, rewritten after every
stage so a call cut short still returns them: ``gpu_check.json`` (merged with the checks
of earlier stages of the same device and torch, from ``DIR/gpu_check.json`` or else
``--previous FILE``): ``device``, ``date``, ``torch``, ``megatron_core``, ``checks`` (name
-> {passed, detail}), ``gather_vs_d2d`` (rows of at least 64 MiB) and
``scatter_vs_local_add``; and ``gpu_check_logs.tar.gz``, every command's log (kept in
``--log-dir``, outside DIR). ``--budget-s`` caps the whole run: each command gets at most
what is left, and a stage with no time left records ``<stage>_not_run``. Exit status: 0
when every check of the stages run passed, 1 otherwise, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_check_common import (GATHER_MIN_MIB, LOGS_NAME, RECORD_NAME, Check,  # noqa: E402
                              Context, Stage, _probe, _tail, _train, _training_check,
                              assemble_record, attention_checks, bench_ratios,
                              compare_losses, pytest_counts, replan_costs, run_command,
                              write_outputs)
from gpu_check_residency import stage_dp2_residency  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULT_PATH = os.path.join("benchmarks", "results", "gpu_check.json")
"""Where the committed record lives (pass it as ``--previous`` to merge into it)."""
QUICK_STAGES = ("attention", "hf-config", "setup", "build", "device-choice",
                "train-zbv-bf16-packed", "train-pp2-nccl")
"""``--quick``: the issue-21 features (packed attention parity and timing, rope_parameters,
device choice, packed bf16 training, pp=2 over NCCL or its named skip) in one call."""
QUICK_BUDGET_S = 290
"""``--quick``'s default ``--budget-s``: one 5-minute call with time to write the record."""
BENCH_PATH = os.path.join("benchmarks", "results", "transport_gpu.json")
GATHER_TARGET = 0.7
"""gather (rank 0 alone) / device-to-device copy at >= 64 MiB (issue 3's target)."""
NO_DEVICE = "no CUDA device"
STEP_BUDGET_S = 420
"""The step stage's cap (its runs share it; setup and build come first in one call)."""

# A small GPT that the GPU runs in seconds; the fp32 comparison uses a smaller one so the
# CPU reference stays fast.
GPU_MODEL = ["--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "4",
             "--seq-length", "512", "--max-position-embeddings", "512", "--mock-data",
             "--vocab-size", "1024", "--micro-batch-size", "2", "--global-batch-size", "16",
             "--lr", "1e-3", "--min-lr", "1e-4", "--lr-warmup-iters", "2", "--seed", "11",
             "--no-progress-bar", "--log-interval", "1", "--train-iters", "8",
             "--pipeline-model-parallel-size", "1", "--distributed-timeout-minutes", "3"]
PARITY_MODEL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                "--seq-length", "64", "--max-position-embeddings", "64", "--mock-data",
                "--vocab-size", "128", "--micro-batch-size", "2", "--global-batch-size", "8",
                "--lr", "1e-3", "--min-lr", "1e-4", "--lr-warmup-iters", "1", "--seed", "5",
                "--no-progress-bar", "--log-interval", "1", "--train-iters", "5",
                "--pipeline-model-parallel-size", "1", "--distributed-timeout-minutes", "3"]
# Llama-shaped (RMSNorm, SwiGLU, RoPE, GQA 4 heads / 2 groups) on packed rows, bf16
PACKED_MODEL = ["--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "4",
                "--group-query-attention", "--num-query-groups", "2",
                "--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
                "--disable-bias-linear", "--seq-length", "512",
                "--max-position-embeddings", "512", "--mock-data", "--vocab-size", "1024",
                "--micro-batch-size", "2", "--global-batch-size", "16", "--pack-sequences",
                "--bf16", "--lr", "1e-3", "--min-lr", "1e-4", "--lr-warmup-iters", "2",
                "--seed", "11", "--no-progress-bar", "--log-interval", "1",
                "--train-iters", "6", "--distributed-timeout-minutes", "2"]
QUICK_ATTENTION = ["--parity-seq", "4096", "--parity-heads", "32", "--parity-groups", "8",
                   "--seq", "4096", "--warmup", "1", "--repeats", "3", "--no-fp32-flex"]
"""One shape for parity and timing (flex compiles once) in ``--quick``."""

__all__ = ["Check", "Stage", "STAGES", "stage_names", "select_stages", "assemble_record",
           "bench_ratios", "compare_losses", "pytest_counts", "replan_costs",
           "attention_checks", "write_outputs", "run_command", "Context", "QUICK_STAGES",
           "main"]


# ----- pure helpers (CPU-tested) -------------------------------------------------------------
def stage_names() -> list[str]:
    return [stage.name for stage in STAGES]


def select_stages(requested: list[str] | None) -> list[Stage]:
    """The stages to run, in pipeline order: all when ``requested`` is empty or ["all"]; a
    ValueError names an unknown one."""
    if not requested or requested == ["all"]:
        return list(STAGES)
    unknown = [name for name in requested if name not in stage_names()]
    if unknown:
        raise ValueError(f"unknown --stage {unknown}; choose from {stage_names()} or all")
    return [stage for stage in STAGES if stage.name in requested]


# ----- stages ------------------------------------------------------------------------------
def _stage_setup(context: Context) -> list[Check]:
    probe = [context.python, "-c", "import megatron.core as m; print(m.__version__)"]
    status, output = run_command(context, "setup-probe", probe, timeout_s=120)
    if status != 0:
        wheels = sorted(glob.glob(os.path.join(context.root, ".whl", "megatron_core-*.whl")))
        if not wheels:
            return [Check(name="megatron_core", passed=False,
                          detail="megatron-core is not installed and .whl/ holds no "
                                 "megatron_core-*.whl to install it from")]
        status, output = run_command(
            context, "setup-install",
            [context.python, "-m", "pip", "install", "--no-index", "--find-links",
             os.path.join(context.root, ".whl"), wheels[-1]], timeout_s=300)
        if status != 0:
            return [Check(name="megatron_core", passed=False,
                          detail=f"pip install --no-index {os.path.basename(wheels[-1])} "
                                 f"failed: {_tail(output)}")]
        status, output = run_command(context, "setup-probe", probe, timeout_s=120)
    return [Check(name="megatron_core", passed=status == 0,
                  detail=output.strip().splitlines()[-1] if output.strip() else "no output")]


def _stage_build(context: Context) -> list[Check]:
    archs = os.environ.get("ODC_PP_CUDA_ARCHS") or _probe(
        context, "build-arch", "import torch; print('%d%d' % torch.cuda.get_device_capability(0))")
    env = {"ODC_PP_NO_CUDA": "0", **({"ODC_PP_CUDA_ARCHS": archs} if archs else {})}
    status, output = run_command(context, "build",
                                 [context.python, "setup.py", "build_ext", "--inplace"],
                                 timeout_s=480, env=env)
    if status != 0:
        return [Check(name="build_extensions", passed=False,
                      detail=f"setup.py build_ext failed (exit {status}): {_tail(output)}")]
    probe = ("import odc_pp._C, odc_pp._C_cuda as c; n = c.device_count(); "
             "print('devices', n); assert n >= 1, 'odc_pp._C_cuda sees no CUDA device'")
    status, output = run_command(context, "build-probe", [context.python, "-c", probe],
                                 timeout_s=60)
    return [Check(name="build_extensions", passed=status == 0,
                  detail=f"ODC_PP_CUDA_ARCHS={archs or 'default'}: {_tail(output, 3)}")]


def _stage_attention(context: Context) -> list[Check]:
    out = os.path.join(context.log_dir, "packed_attention.json")
    if os.path.exists(out):
        os.remove(out)
    status, output = run_command(
        context, "attention", [context.python, "benchmarks/bench_packed_attention.py",
                               "--out", out, *(QUICK_ATTENTION if context.quick else [])],
        timeout_s=150 if context.quick else 420)
    if not os.path.exists(out):
        return [Check(name="packed_attention_parity", passed=False,
                      detail=f"exit {status}: {_tail(output)}")]
    with open(out) as handle:
        return attention_checks(json.load(handle))


def _stage_hf_config(context: Context) -> list[Check]:
    version = _probe(context, "hf-config-version", "import transformers as t; print(t.__version__)")
    status, output = run_command(
        context, "hf-config", [context.python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "tests/unit/models/test_hf_config.py"], timeout_s=180)
    counts = pytest_counts(output)
    return [Check(name="hf_config_installed_transformers",
                  passed=status == 0 and counts.get("passed", 0) > 0,
                  detail=f"transformers {version}: exit {status}, {counts}")]


def _stage_device_choice(context: Context) -> list[Check]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
    env = {"CUDA_VISIBLE_DEVICES": visible, "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
           "RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "29531"}
    flags = PACKED_MODEL[:PACKED_MODEL.index("--train-iters")] + ["--train-iters", "2"]
    status, output, records = _train(context, "device-choice", flags + [
        "--pipeline-schedule", "1f1b"], timeout_s=240, env=env)
    check = _training_check("device_choice_one_visible_gpu", status, output, records, 2)
    return [Check(name=check.name, passed=check.passed,
                  detail=f"LOCAL_RANK=1, one visible GPU (CUDA_VISIBLE_DEVICES={visible}): "
                         + check.detail)]


def _stage_packed(context: Context) -> list[Check]:
    flags = PACKED_MODEL + ["--pipeline-schedule", "zbv", "--pipeline-model-parallel-size", "1"]
    status, output, records = _train(context, "train-zbv-bf16-packed", flags, timeout_s=300)
    return [_training_check("train_zbv_bf16_packed", status, output, records, 6)]


def _gpu_count(context: Context) -> int:
    count = _probe(context, "gpu-count", "import torch; print(torch.cuda.device_count())")
    return int(count) if count and count.isdigit() else 0


def _stage_pp2_nccl(context: Context) -> list[Check]:
    count = _gpu_count(context)
    if count < 2:
        return [Check(name="train_pp2_nccl_skipped", passed=True,
                      detail=f"not run: {count} GPU(s); pp=2 over NCCL needs two (NCCL "
                             f"refuses two ranks on one GPU)")]
    checks = []
    for schedule in ("1f1b", "zbv"):
        flags = PACKED_MODEL + ["--pipeline-schedule", schedule,
                                "--pipeline-model-parallel-size", "2"]
        status, output, records = _train(context, f"train-pp2-nccl-{schedule}", flags,
                                         timeout_s=270, nproc=2)
        checks.append(_training_check(f"train_pp2_nccl_{schedule}", status, output, records, 6))
    return checks


def _stage_dp2_shared(context: Context) -> list[Check]:
    """pretrain_gpt.py at dp=2 (ODC over CUDA IPC, LB-Mini packed rows) with both ranks on
    one GPU (``--distributed-backend gloo``), against the same flags on CPU: equal losses. No
    timing: the two ranks share the GPU (issue 29, Deliver 5)."""
    flags = PARITY_MODEL + ["--pipeline-schedule", "1f1b", "--dp-mode", "odc",
                            "--load-balance", "lb-mini", "--packed-attention", "dense",
                            "--distributed-backend", "gloo"]
    env = {"CUDA_VISIBLE_DEVICES": "0"}
    gpu = _train(context, "train-dp2-shared-gpu", flags, timeout_s=100, nproc=2, env=env)
    cpu = _train(context, "train-dp2-shared-cpu", flags, timeout_s=80, nproc=2,
                 env={"CUDA_VISIBLE_DEVICES": ""})
    checks = [_training_check("train_dp2_odc_one_gpu", *gpu, 5),
              _training_check("train_dp2_odc_cpu", *cpu, 5)]
    ipc = "falling back to --dp-mode collective" not in gpu[1]
    if all(check.passed for check in checks):
        ok, detail = compare_losses([r["loss"] for r in cpu[2]], [r["loss"] for r in gpu[2]])
        ok, detail = ok and ipc, f"{'CUDA IPC' if ipc else 'NOT CUDA IPC (fell back)'}; {detail}"
    else:
        ok, detail = False, "a run failed (see the two checks above)"
    return checks + [Check(name="train_dp2_odc_one_gpu_matches_cpu", passed=ok,
                           detail=detail)]


def _stage_pytest(context: Context) -> list[Check]:
    status, output = run_command(
        context, "pytest-gpu",
        [context.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu",
         "-rfEs", "tests"], timeout_s=580)
    counts = pytest_counts(output)
    ok = status == 0 and counts.get("passed", 0) > 0 and not counts.get("failed")
    failed = [line for line in output.splitlines() if line.startswith(("FAILED", "ERROR"))]
    return [Check(name="pytest_gpu", passed=ok,
                  detail=f"exit {status}, {counts}" + (f"; {failed[:10]}" if failed else ""))]


def _stage_bench(context: Context) -> list[Check]:
    out = os.path.join(context.root, BENCH_PATH)
    status, output = run_command(
        context, "bench-transport",
        [context.python, "benchmarks/bench_transport_gpu.py", "--json", "--out", out,
         "--sizes-mib", "16", "64", "256", "1024"], timeout_s=560)
    if status != 0 or not os.path.exists(out):
        return [Check(name="bench_transport_gpu", passed=False,
                      detail=f"exit {status}: {_tail(output)}")]
    with open(out) as handle:
        context.bench = json.load(handle)
    gather, scatter = bench_ratios(context.bench["rows"])
    worst = min((row["gather_alone_vs_d2d"] for row in gather), default=float("nan"))
    return [Check(name="bench_transport_gpu", passed=True,
                  detail=f"{len(context.bench['rows'])} sizes measured"),
            Check(name="gather_vs_d2d_target", passed=bool(gather) and worst >= GATHER_TARGET,
                  detail=f"gather (rank 0 alone) / d2d copy at >= {GATHER_MIN_MIB} MiB: worst "
                         f"{worst:.2f} (target {GATHER_TARGET})"),
            Check(name="scatter_vs_local_add", passed=True,
                  detail=", ".join(f"{row['mib']:.0f} MiB {row['scatter_vs_local_add']:.2f}x"
                                   for row in scatter))]


def _stage_zbv(context: Context) -> list[Check]:
    flags = GPU_MODEL + ["--pipeline-schedule", "zbv", "--bf16",
                         "--enable-optimizer-post-validation"]
    status, output, records = _train(context, "train-zbv-bf16", flags, timeout_s=560)
    return [_training_check("train_zbv_bf16_post_validation", status, output, records, 8)]


def _stage_parity(context: Context) -> list[Check]:
    flags = PARITY_MODEL + ["--pipeline-schedule", "1f1b"]
    gpu = _train(context, "train-1f1b-fp32-gpu", flags, timeout_s=250)
    cpu = _train(context, "train-1f1b-fp32-cpu", flags, timeout_s=300,
                 env={"CUDA_VISIBLE_DEVICES": ""})
    checks = [_training_check("train_1f1b_fp32_gpu", gpu[0], gpu[1], gpu[2], 5),
              _training_check("train_1f1b_fp32_cpu", cpu[0], cpu[1], cpu[2], 5)]
    if all(check.passed for check in checks):
        ok, detail = compare_losses([r["loss"] for r in cpu[2]], [r["loss"] for r in gpu[2]])
    else:
        ok, detail = False, "a run failed (see the two checks above)"
    return checks + [Check(name="train_1f1b_fp32_gpu_matches_cpu", passed=ok, detail=detail)]


def _stage_offload(context: Context) -> list[Check]:
    flags = GPU_MODEL + ["--pipeline-schedule", "offload", "--cpu-offload"]
    status, output, records = _train(context, "train-offload", flags, timeout_s=560)
    check = _training_check("train_offload", status, output, records, 8)
    reserved = [record.get("peak_memory_mb") for record in records]
    if check.passed and not all(value and value > 0 for value in reserved):
        check = Check(name=check.name, passed=False,
                      detail=f"peak reserved memory missing from the log: {reserved}")
    return [check]


def _stage_zb_auto(context: Context) -> list[Check]:
    flags = GPU_MODEL + ["--pipeline-schedule", "zb-auto"]
    status, output, records = _train(context, "train-zb-auto", flags, timeout_s=560)
    check = _training_check("train_zb_auto", status, output, records, 8)
    costs = replan_costs(output)
    measured = bool(costs) and all(t_f > 0 and t_b > 0 for t_f, t_b, _ in costs)
    return [check, Check(name="zb_auto_replanned_from_event_timings",
                         passed=check.passed and measured,
                         detail=f"measured T_F/T_B/T_W ms per stage: {costs}" if costs
                         else "no 'zb-auto re-planned' line in the output")]


def _stage_bench_tp(context: Context) -> list[Check]:
    """The GPU rows of benchmarks/bench_tp.py (tp=2 vs pp=2 vs pp=2 + offload): two
    processes on two GPUs (NCCL refuses two ranks on one GPU)."""
    count = _gpu_count(context)
    if count < 2:
        # not a failure of this machine, and not a measurement: named as skipped
        return [Check(name="bench_tp_gpu_skipped", passed=True,
                      detail=f"not run: {count} GPU(s); tp=2 needs two GPUs")]
    out = os.path.join(context.root, "benchmarks", "results", "tp_gpu.json")
    status, output = run_command(
        context, "bench-tp", [context.python, "benchmarks/bench_tp.py", "--json", "--out",
                              out, "--rounds", "2"], timeout_s=540)
    return [Check(name="bench_tp_gpu", passed=status == 0 and os.path.exists(out),
                  detail=f"exit {status}: {_tail(output, 3)}")]


def _stage_step(context: Context) -> list[Check]:
    """benchmarks/bench_gpu_step.py: the Llama-3-8B-shaped step (full rows 1f1b / zbv, the
    lb-mini packed path, unpacked, the Hugging Face baseline); one check per run and one
    per issue-29 target (passed = met; the detail gives the distance)."""
    out = os.path.join(context.log_dir, "gpu_step.json")
    if os.path.exists(out):
        os.remove(out)
    budget = max(30, min(STEP_BUDGET_S, context.time_left() - 15))
    status, output = run_command(
        context, "step", [context.python, "benchmarks/bench_gpu_step.py", "--out", out,
                          "--work", os.path.join(context.log_dir, "gpu_step"),
                          "--budget-s", f"{budget:.0f}"], timeout_s=budget + 10)
    if not os.path.exists(out):
        return [Check(name="gpu_step", passed=False, detail=f"exit {status}: {_tail(output)}")]
    with open(out) as handle:
        result = json.load(handle)
    checks = [Check(name=f"gpu_step_{name.replace('-', '_')}", passed=row.get("exit") == 0,
                    detail=json.dumps({k: row[k] for k in ("step_s", "tokens_per_s", "mfu",
                                                           "peak_allocated_gb", "error")
                                       if k in row})[:600])
              for name, row in result["runs"].items()]
    for key, verdict in result.get("verdicts", {}).items():
        if verdict.get("status") == "unmeasured":
            continue
        checks.append(Check(name=f"gpu_step_target_{key}", passed=verdict["status"] == "met",
                            detail=f"{verdict['value']:.3f} (target {verdict['target']})"))
    return checks


STAGES: tuple[Stage, ...] = (
    Stage(name="attention", summary="packed attention kernels vs the dense path, timings",
          timeout_s=420, run=_stage_attention),
    Stage(name="hf-config", summary="tests/unit/models/test_hf_config.py, installed transformers",
          timeout_s=200, run=_stage_hf_config),
    Stage(name="setup", summary="megatron-core importable (installed from .whl/ if missing)",
          timeout_s=540, run=_stage_setup),
    Stage(name="build", summary="build odc_pp._C and odc_pp._C_cuda in place",
          timeout_s=540, run=_stage_build),
    Stage(name="device-choice", summary="pretrain_gpt.py as LOCAL_RANK=1 seeing one GPU",
          timeout_s=240, run=_stage_device_choice),
    Stage(name="pytest-gpu", summary="pytest -m gpu", timeout_s=580, run=_stage_pytest),
    Stage(name="bench-transport", summary="benchmarks/bench_transport_gpu.py",
          timeout_s=560, run=_stage_bench),
    Stage(name="train-zbv-bf16", summary="pretrain_gpt.py: zbv, bf16, post-validation",
          timeout_s=560, run=_stage_zbv),
    Stage(name="train-zbv-bf16-packed", summary="pretrain_gpt.py: zbv, bf16, Llama, packed",
          timeout_s=300, run=_stage_packed),
    Stage(name="train-1f1b-fp32", summary="pretrain_gpt.py: 1f1b fp32, GPU vs CPU losses",
          timeout_s=550, run=_stage_parity),
    Stage(name="train-pp2-nccl", summary="pretrain_gpt.py: pp=2 over NCCL (two GPUs)",
          timeout_s=560, run=_stage_pp2_nccl),
    Stage(name="train-dp2-shared", summary="pretrain_gpt.py: dp=2 ODC, two ranks on one GPU "
          "vs CPU", timeout_s=420, run=_stage_dp2_shared),
    Stage(name="train-dp2-residency", summary="pretrain_gpt.py: dp=2 on one GPU, "
          "--odc-param-residency layer vs minibatch", timeout_s=420, run=stage_dp2_residency),
    Stage(name="train-offload", summary="pretrain_gpt.py: offload schedule, reserved memory",
          timeout_s=560, run=_stage_offload),
    Stage(name="train-zb-auto", summary="pretrain_gpt.py: zb-auto re-planned from events",
          timeout_s=560, run=_stage_zb_auto),
    Stage(name="step", summary="benchmarks/bench_gpu_step.py: the 8B-shaped step vs HF",
          timeout_s=STEP_BUDGET_S + 20, run=_stage_step),
    Stage(name="bench-tp", summary="benchmarks/bench_tp.py on two GPUs (skipped on one)",
          timeout_s=600, run=_stage_bench_tp),
)


# ----- main --------------------------------------------------------------------------------
def _environment(python: str) -> dict:
    probe = ("import json, torch\n"
             "try:\n    import megatron.core as m; mc = m.__version__\n"
             "except Exception:\n    mc = None\n"
             "print(json.dumps({'device': torch.cuda.get_device_name(0) "
             f"if torch.cuda.is_available() else {NO_DEVICE!r}, "
             "'torch': torch.__version__, 'megatron_core': mc}))")
    done = subprocess.run([python, "-c", probe], text=True, capture_output=True, check=False)
    if done.returncode != 0:
        return {"device": "unknown", "torch": "unknown", "megatron_core": None}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _previous_record(out_dir: str, previous: str | None) -> dict | None:
    for path in (os.path.join(out_dir, RECORD_NAME), previous):
        if path and os.path.exists(path):
            with open(path) as handle:
                return json.load(handle)
    return None


def _parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", action="append",
                        help=f"run only this stage (repeatable): {', '.join(stage_names())}, all")
    parser.add_argument("--quick", action="store_true",
                        help=f"the stages {', '.join(QUICK_STAGES)} within --budget-s "
                             f"(default {QUICK_BUDGET_S} s): one 5-minute call")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="wall-clock cap of the whole run (each command gets what is left)")
    parser.add_argument("--list", action="store_true", help="print the stages and exit")
    parser.add_argument("--python", default=sys.executable, help="interpreter for the stages")
    parser.add_argument("--out", default=os.path.join(ROOT, "out", "gpu_check"),
                        help=f"DIRECTORY receiving {RECORD_NAME} and {LOGS_NAME}")
    parser.add_argument("--previous", default=None,
                        help=f"a record to merge into when --out has none (e.g. {RESULT_PATH})")
    parser.add_argument("--log-dir", default=os.path.join(ROOT, "out", "gpu_check_logs"),
                        help="where each command's log is kept (packed into --out)")
    parser.add_argument("--allow-cpu", action="store_true",
                        help="run without a CUDA device (tries the script itself; the "
                             "record then proves nothing about GPUs)")
    args = parser.parse_args(argv)
    if args.out.endswith(".json"):
        parser.error(f"--out {args.out}: give a directory (it receives {RECORD_NAME} and "
                     f"{LOGS_NAME})")
    if args.quick and args.stage:
        parser.error("--quick picks its own stages; drop --stage")
    try:
        stages = select_stages(list(QUICK_STAGES) if args.quick else args.stage)
    except ValueError as error:
        parser.error(str(error))
    if args.quick and args.budget_s is None:
        args.budget_s = QUICK_BUDGET_S
    return args, stages


def main(argv=None) -> int:
    started = time.monotonic()
    args, stages = _parse(argv)
    if args.list:
        for stage in STAGES:
            print(f"{stage.name:22s} {stage.summary} (<= {stage.timeout_s} s)")
        return 0
    context = Context(python=args.python, root=ROOT, log_dir=args.log_dir, quick=args.quick,
                      deadline=None if args.budget_s is None else started + args.budget_s)
    environment = _environment(args.python)
    if not args.allow_cpu and environment["device"] == NO_DEVICE:
        print(f"gpu_check: {args.python} sees no CUDA device (torch.cuda.is_available() is "
              "False); run this on the GPU machine (or pass --allow-cpu to try the script)",
              file=sys.stderr)
        return 2
    all_passed = True
    for stage in stages:
        print(f"[gpu_check] stage {stage.name}: {stage.summary}", flush=True)
        ran = context.time_left() >= 20
        checks = stage.run(context) if ran else [
            Check(name=f"{stage.name.replace('-', '_')}_not_run", passed=False,
                  detail=f"no time left in --budget-s {args.budget_s:g}")]
        for check in checks:
            print(f"[gpu_check]   {'PASS' if check.passed else 'FAIL'} {check.name}: "
                  f"{check.detail}", flush=True)
        all_passed &= all(check.passed for check in checks)
        if ran and stage.name == "setup":  # megatron-core may have been installed
            environment = _environment(args.python)
        record = assemble_record(
            _previous_record(args.out, args.previous), device=environment["device"],
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            torch_version=environment["torch"], megatron_core=environment["megatron_core"],
            checks=checks, bench=context.bench)
        write_outputs(args.out, record, args.log_dir)
    print(f"[gpu_check] {'all checks passed' if all_passed else 'some checks FAILED'} in "
          f"{time.monotonic() - started:.0f} s; record: {os.path.join(args.out, RECORD_NAME)}")
    return 0 if all_passed else 1


if __name__ == "__main__":
    sys.exit(main())
