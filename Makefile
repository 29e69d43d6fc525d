# The two set-up commands of the README: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PIPELINE_HOME ?= $(CURDIR)/.pipeline
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home

AZURITE := .azurite/node_modules/.bin/azurite-blob
.PHONY: demo test lint dev clean-demo azurite

$(STAMP): pyproject.toml requirements/lock.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip uv
	$(BIN)/uv pip install --python $(BIN)/python --compile-bytecode --quiet -r requirements/lock.txt
	$(BIN)/uv pip install --python $(BIN)/python --compile-bytecode --quiet --no-deps -e .
	touch $(STAMP)

## Run the full storyboard demo on the embedded default (SQLite ledger, local Dagster home).
demo: $(STAMP) $(DAGSTER_HOME)/dagster.yaml
	$(BIN)/storyboard demo

## Run the whole test suite, PostgreSQL included (PIPELINE_TEST_PG_URL or an embedded server).
## --dist loadfile keeps a module on one worker, so module fixtures (the dagster dev webserver of
## tests/cli/test_launch_paths.py) start once; xdist 3.8's loadgroup does not group under pytest 9.
## --durations=25: the slowest 25 tests are printed with every run (and so in CI's log).
test: $(STAMP) azurite
	$(BIN)/python -m pytest -n 2 --dist loadfile -q --durations=25

## The Azure Blob emulator (azurite, pinned in requirements/azurite) the storage tests run
## against, installed with npm into .azurite; without npm those tests skip (CI fails them).
azurite: $(AZURITE)
$(AZURITE): requirements/azurite/package.json requirements/azurite/package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
	  mkdir -p .azurite && cp requirements/azurite/package.json requirements/azurite/package-lock.json .azurite/ && \
	  npm ci --prefix .azurite --no-audit --no-fund --loglevel=error && touch $@; \
	else echo "npm not found: the Azure storage tests will skip (install Node.js and npm)"; fi

## Lint, format, import layers, types (mypy: [tool.mypy] in pyproject.toml, cache in .mypy_cache),
## then load the Definitions the way Dagster does.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy
	VIRTUAL_ENV=$(CURDIR)/$(VENV) $(BIN)/dg check defs

## Start the Dagster UI on the code location: `make dev` (port 3000), `make dev PORT=3001`
## (a second checkout, or a port someone else holds). Ctrl-C, or a SIGTERM to make, stops
## every process it started (pipeline_defs/cli/supervise.py).
PORT ?= 3000
dev: $(STAMP) $(DAGSTER_HOME)/dagster.yaml
	exec env VIRTUAL_ENV=$(CURDIR)/$(VENV) $(BIN)/python -m pipeline_defs.cli.supervise $(BIN)/dg dev --port $(PORT)

## A local Dagster home: SQLite storage, no telemetry, no community pop-up (kept if it exists).
$(DAGSTER_HOME)/dagster.yaml:
	mkdir -p $(DAGSTER_HOME)
	printf 'telemetry:\n  enabled: false\nnux:\n  enabled: false\n' > $@

clean-demo:
	rm -rf .pipeline .dagster_home
