# The two commands of the README: `make report` (main job) and `make test` (tests).
# Both create their own virtual environment in .venv from nothing but python3, pinned by constraints.txt.
PYTHON ?= python3
VENV   ?= .venv
# The CPU build of torch; on a GPU machine use its own torch (see docs/cli.md "Running on a GPU", environment-gpu.yml).
TORCH_SPEC ?= torch==2.13.0
# Every other package at the version of constraints.txt (pip -c); CONSTRAINTS= resolves afresh instead.
CONSTRAINTS ?= constraints.txt
# make test: pytest-xdist workers (auto: one per core); each test file stays on one worker (module fixtures, one Ray).
XDIST ?= -n auto --dist loadfile
PY := $(VENV)/bin/python
PIP_INSTALL := $(PY) -m pip install $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
# the suite reads its own imports from __pycache__ even where the environment says not to write bytecode
TEST_ENV := PYTHONDONTWRITEBYTECODE=

.PHONY: report test test-fast test-gpu lab venv clean-venv check-chromium
# the browser tests and `mla-lab check-report` drive the system Chromium (mla_lab/report/browser.py CHROMIUM_NAMES)
CHROMIUM_NAMES := chromium chromium-browser google-chrome google-chrome-stable chrome
# BROWSER=skip: run `make test` without Chromium (its 8 browser tests are then skipped, and say so)
BROWSER ?=

$(VENV)/.stamp: pyproject.toml $(CONSTRAINTS)
	@echo "[make] 1/5 virtual environment $(VENV) ($$($(PYTHON) --version))"
	$(PYTHON) -m venv $(VENV)
	@echo "[make] 2/5 pip"
	$(PIP_INSTALL) --upgrade pip
	@echo "[make] 3/5 torch ($(TORCH_SPEC))"
	$(PIP_INSTALL) $(TORCH_SPEC)
	@echo "[make] 4/5 mla_lab with the lab and dev extras ($(if $(CONSTRAINTS),versions of $(CONSTRAINTS),resolved afresh))"
	$(PIP_INSTALL) -e ".[lab,dev]"
	@echo "[make] 5/5 the mla-lab Jupyter kernel"
	$(PY) -m mla_lab.kernelspec
	touch $@
	@echo "[make] environment ready: $(VENV)"

venv: $(VENV)/.stamp

## main job: run the sweep notebook through papermill and publish reports/
report: $(VENV)/.stamp
	$(VENV)/bin/mla-lab sweep $(ARGS)

## Chromium for the browser tests and `mla-lab check-report`: $CHROMIUM or one of CHROMIUM_NAMES on PATH
check-chromium:
	@if [ -n "$$CHROMIUM" ] && [ -x "$$CHROMIUM" ]; then exit 0; fi; \
	for n in $(CHROMIUM_NAMES); do command -v $$n >/dev/null 2>&1 && exit 0; done; \
	echo "make: no Chromium (looked for \$$CHROMIUM and $(CHROMIUM_NAMES) on PATH): the browser tests and mla-lab check-report need it; install it (Debian/Ubuntu: sudo apt-get install chromium), set CHROMIUM=/path/to/chrome, or run make test BROWSER=skip" >&2; \
	exit 1

## tests (CPU; GPU tests are skipped with the reason)
test: $(if $(filter skip,$(BROWSER)),,check-chromium) $(VENV)/.stamp
	$(TEST_ENV) $(PY) -m pytest -q $(XDIST) $(PYTEST_ARGS)

## the fast subset (<= 45 s on 2 idle cores): everything not marked slow; tests/conftest.py lists the slow files
## (papermill notebook runs, Ray, the published report in Chromium, the Triton interpreter, the kill/resume runs) and
## fails a test not marked slow that takes over 10 s
test-fast: $(VENV)/.stamp
	$(TEST_ENV) $(PY) -m pytest -q -m "not slow" $(XDIST) $(PYTEST_ARGS)

## on a GPU machine: the GPU tests only, and a skip (no CUDA, no flash_mla) is a failure (MLA_LAB_REQUIRE_GPU=1)
test-gpu: $(VENV)/.stamp
	MLA_LAB_REQUIRE_GPU=1 $(TEST_ENV) $(PY) -m pytest -q -m gpu $(PYTEST_ARGS)

## JupyterLab on notebooks/, opening the interactive explorer (LAB_ARGS: e.g. --no-browser --ip=0.0.0.0)
lab: $(VENV)/.stamp
	$(VENV)/bin/jupyter lab notebooks/explore.ipynb $$( [ "$$(id -u)" = 0 ] && echo --allow-root ) $(LAB_ARGS)

clean-venv:
	rm -rf $(VENV)
