# Two commands: `make demo` and `make test`. Both work on a fresh machine: they create
# .venv, install the pinned dependencies and this package (editable, building odc_pp._C).
# A second lane, `make test-mcore MCORE=0.19.2` (and `make test-mcore-all`), runs the tests
# that touch megatron-core under Python 3.12 with a newer megatron-core (docs/megatron.md).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# CPU machines: the local CPU wheel. On a GPU box: make TORCH_SPEC='torch>=2.6' ...
TORCH_SPEC ?= torch==2.13.0
# the main lane's megatron-core (Python 3.11; the pin in pyproject.toml is wider)
MCORE_MAIN ?= 0.16.1
STAMP := $(VENV)/.odc-pp-installed
CSRC := $(wildcard csrc/*.cpp csrc/*.h csrc/*/*.cpp csrc/*/*.h csrc/*.cu csrc/*/*.cu)

.PHONY: demo test test-unit test-dist test-e2e test-gpu install clean test-mcore test-mcore-all

demo: $(STAMP)
	$(PY) -m odc_pp.demo

# Every tier in one run (tests/unit, tests/dist, tests/e2e, tests/gpu: docs/testing.md).
test: $(STAMP)
	$(PY) -m pytest -q --durations=15 tests

# No process group: the fast tier (a few minutes on 2 cores).
test-unit: $(STAMP)
	$(PY) -m pytest -q --durations=15 tests/unit

# gloo process groups, one and several ranks.
test-dist: $(STAMP)
	$(PY) -m pytest -q --durations=15 tests/dist

# python -m odc_pp.train under torchrun, the wheel build and a pip install.
test-e2e: $(STAMP)
	$(PY) -m pytest -q --durations=15 tests/e2e

# CUDA-only tests (skipped without a GPU); `pytest -m gpu tests` adds the gpu-marked
# tests of the other tiers.
test-gpu: $(STAMP)
	$(PY) -m pytest -q --durations=15 tests/gpu

install: $(STAMP)

$(STAMP): setup.py pyproject.toml $(CSRC)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check "$(TORCH_SPEC)"
	$(PY) -m pip install -q --disable-pip-version-check "setuptools>=64" wheel "pybind11>=2.12" \
		"megatron-core==$(MCORE_MAIN)" numpy matplotlib pytest pytest-timeout hypothesis \
		"transformers==4.57.6" "safetensors==0.8.0" wandb psutil "tensorboard==2.21.0"
	$(PY) -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps -e .
	touch $(STAMP)

clean:
	rm -rf $(VENV) build *.egg-info odc_pp/_C*.so

# ----- the megatron-core lane: Python 3.12 (megatron-core 0.17+ ship cp312-only wheels) ------
MCORE ?= 0.19.2
MCORE_VERSIONS ?= 0.17.1 0.19.2
PYTHON312 ?= $(shell pyenv root 2>/dev/null)/versions/3.12.1/bin/python3.12
MCORE_VENV_PREFIX ?= .venv-mcore-
MCORE_VENV ?= $(MCORE_VENV_PREFIX)$(MCORE)
MCORE_PY := $(MCORE_VENV)/bin/python
# the registry's default cp312 torch wheel (it brings the CUDA library wheels; runs on CPU)
MCORE_TORCH_SPEC ?= torch==2.13.0
MCORE_LOG ?= benchmarks/results/mcore_lane_$(basename $(MCORE)).txt
# the tests that touch megatron-core: model build + split backward, B/W split parity (pp=2),
# TP (model and end to end), HF import, one end-to-end pp=2 x dp=2 run, dist_checkpointing
MCORE_TESTS ?= tests/dist/runtime/test_model.py \
	"tests/dist/runtime/test_parity.py::test_schedules_match_single_process[2-extra0]" \
	tests/dist/models/test_tp_model.py tests/dist/models/test_hf_logits.py \
	"tests/e2e/training/test_end_to_end.py::test_schedules_and_dp_modes_match_single_process[zb-h1-odc-none-extra0]" \
	"tests/e2e/training/test_tensor_parallel.py::test_layout_matches_single_process[tp2]" \
	tests/e2e/training/test_megatron_checkpoint.py

test-mcore: SHELL := /bin/bash
test-mcore:
	test -x $(MCORE_PY) || $(PYTHON312) -m venv $(MCORE_VENV)
	$(MCORE_PY) -m pip install -q --disable-pip-version-check "$(MCORE_TORCH_SPEC)" \
		"setuptools>=64" wheel "pybind11>=2.12" "megatron-core==$(MCORE)" numpy pytest \
		pytest-timeout hypothesis "transformers==4.57.6" "safetensors==0.8.0" psutil
	$(MCORE_PY) -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps -e .
	mkdir -p $(dir $(MCORE_LOG))
	set -o pipefail; { $(MCORE_PY) -c 'import sys, torch, megatron.core as m; \
		print("megatron-core lane: Python", sys.version.split()[0], "torch", \
		torch.__version__, "megatron-core", m.__version__)'; $(MCORE_PY) -m pytest -rA -p no:cacheprovider $(MCORE_TESTS); } 2>&1 | tee $(MCORE_LOG)

test-mcore-all:
	for version in $(MCORE_VERSIONS); do $(MAKE) test-mcore MCORE=$$version || exit 1; done
