# lfbench: the two commands of the README, and the tools behind them.
#   make repro   set up, fetch the data, run the pipeline (dvc repro on params.yaml)
#   make test    set up, lint, type-check and run the tests
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
export PATH := $(BIN):$(PATH)
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: repro test setup setup-dev lint typecheck unit lock clean-venv

$(VENV)/.runtime: requirements.lock requirements-nodeps.lock pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --require-hashes -r requirements.lock
	$(BIN)/pip install --quiet --require-hashes --no-deps -r requirements-nodeps.lock
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	@touch $@

$(VENV)/.dev: requirements-dev.lock requirements-nodeps.lock pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --require-hashes -r requirements-dev.lock
	$(BIN)/pip install --quiet --require-hashes --no-deps -r requirements-nodeps.lock
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	@touch $@ $(VENV)/.runtime

setup: $(VENV)/.runtime
setup-dev: $(VENV)/.dev

## The main job: data (from $$LFBENCH_DATA_MIRROR or the pinned public sources), params.yaml and
## the stages' code dependencies checked, then dvc repro.
repro: setup
	lfbench data fetch
	lfbench check
	dvc repro

## The tests: lint, format, types, then pytest (unit, stage and end-to-end tests).
test: setup-dev lint typecheck
	pytest

lint: setup-dev
	ruff check pipeline tests perf scripts
	ruff format --check pipeline tests perf scripts

typecheck: setup-dev
	mypy

## Regenerate the hash-locked requirements (needs network access to PyPI).
lock: setup-dev
	$(BIN)/pip install --quiet uv
	uv pip compile pyproject.toml requirements-build.in --universal --python-version 3.11 \
	  --generate-hashes --no-header -q -o requirements.lock
	uv pip compile pyproject.toml requirements-build.in --extra dev --universal \
	  --python-version 3.11 --generate-hashes --no-header -q -c requirements.lock \
	  -o requirements-dev.lock
	uv pip compile requirements-nodeps.in --no-deps --generate-hashes --no-header -q \
	  -o requirements-nodeps.lock

clean-venv:
	rm -rf $(VENV)
