# The two commands of the README: `make report` (main job) and `make test` (tests).
# Both create their own virtual environment in .venv from nothing but python3.
PYTHON ?= python3
VENV   ?= .venv
# The CPU build of torch; on a GPU machine use its own torch (see README "Running on a GPU").
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python

.PHONY: report test test-fast test-gpu lab venv clean-venv

$(VENV)/.stamp: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e ".[lab,dev]"
	$(PY) -m mla_lab.kernelspec
	touch $@

venv: $(VENV)/.stamp

## main job: run the sweep notebook through papermill and publish reports/
report: $(VENV)/.stamp
	$(VENV)/bin/mla-lab sweep $(ARGS)

## tests (CPU; GPU tests are skipped with the reason)
test: $(VENV)/.stamp
	$(PY) -m pytest -q $(PYTEST_ARGS)

## the fast subset (<= 45 s on 2 cores): everything not marked slow; tests/conftest.py lists the slow files
## (papermill notebook runs, Ray, the published report in Chromium, the Triton interpreter, the kill/resume runs)
test-fast: $(VENV)/.stamp
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

## on a GPU machine: the GPU tests only, and a skip (no CUDA, no flash_mla) is a failure (MLA_LAB_REQUIRE_GPU=1)
test-gpu: $(VENV)/.stamp
	MLA_LAB_REQUIRE_GPU=1 $(PY) -m pytest -q -m gpu $(PYTEST_ARGS)

## JupyterLab on notebooks/, opening the interactive explorer (LAB_ARGS: e.g. --no-browser --ip=0.0.0.0)
lab: $(VENV)/.stamp
	$(VENV)/bin/jupyter lab notebooks/explore.ipynb $$( [ "$$(id -u)" = 0 ] && echo --allow-root ) $(LAB_ARGS)

clean-venv:
	rm -rf $(VENV)
