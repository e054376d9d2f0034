#!/usr/bin/env bash
# One command on a GPU machine (one H100/H200, no network): builds both extensions, runs
# `pytest -m gpu`, the GPU transport benchmark, the packed-attention kernels and training
# smoke runs, and writes gpu_check.json + gpu_check_logs.tar.gz into --out DIR (default
# out/gpu_check). See tools/gpu_check.py for the stages, docs/gpu.md for the lent machine.
#
#   bash tools/gpu_check.sh                     # every stage, in order
#   bash tools/gpu_check.sh --stage build       # one stage (each fits 10 minutes)
#   bash tools/gpu_check.sh --quick --out DIR   # issue 21's stages in one 5-minute call
#   bash tools/gpu_check.sh --list              # the stages
#
# PYTHON picks the interpreter (default: .venv/bin/python if present, else python3).
# megatron-core, when missing, is installed from the wheel carried in .whl/ with
# pip install --no-index. Exit status 0 when every check of the stages run passed.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then
        PYTHON=.venv/bin/python
    else
        PYTHON=python3
    fi
fi
exec "$PYTHON" tools/gpu_check.py --python "$PYTHON" "$@"
