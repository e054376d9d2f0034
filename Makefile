# Two commands: `make demo` and `make test`. Both work on a fresh machine: they create
# .venv, install the pinned dependencies and this package (editable, building odc_pp._C).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# CPU machines: the local CPU wheel. On a GPU box: make TORCH_SPEC='torch>=2.6' ...
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.odc-pp-installed
CSRC := $(wildcard csrc/*.cpp csrc/*.h csrc/*/*.cpp csrc/*/*.h csrc/*.cu csrc/*/*.cu)

.PHONY: demo test test-unit test-dist test-e2e test-gpu install clean

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

# pretrain_gpt.py under torchrun, and the wheel build.
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
		"megatron-core>=0.16.1,<0.17" numpy matplotlib pytest pytest-timeout hypothesis \
		"transformers==4.57.6" "safetensors==0.8.0"
	$(PY) -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps -e .
	touch $(STAMP)

clean:
	rm -rf $(VENV) build *.egg-info odc_pp/_C*.so
