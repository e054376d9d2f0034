#!/usr/bin/env bash
# One command on a GPU machine (one H100/H200, no network): builds both extensions, runs
# `pytest -m gpu`, the GPU transport benchmark and single-GPU training smoke runs, and
# writes benchmarks/results/gpu_check.json. See tools/gpu_check.py for the stages.
#
#   bash tools/gpu_check.sh                     # every stage, in order
#   bash tools/gpu_check.sh --stage build       # one stage (each fits 10 minutes)
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
