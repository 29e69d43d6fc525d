# The two set-up commands of the README: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PIPELINE_HOME ?= $(CURDIR)/.pipeline
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home

.PHONY: demo test lint dev clean-demo

$(STAMP): pyproject.toml requirements/lock.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip uv
	$(BIN)/uv pip install --python $(BIN)/python --compile-bytecode --quiet -r requirements/lock.txt
	$(BIN)/uv pip install --python $(BIN)/python --compile-bytecode --quiet --no-deps -e .
	touch $(STAMP)

## Run the full storyboard demo on the embedded default (SQLite ledger, local Dagster home).
demo: $(STAMP)
	mkdir -p $(DAGSTER_HOME)
	$(BIN)/storyboard demo

## Run the whole test suite, PostgreSQL included (PIPELINE_TEST_PG_URL or an embedded server).
test: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadgroup -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

## Start the Dagster UI on the code location.
dev: $(STAMP)
	mkdir -p $(DAGSTER_HOME)
	$(BIN)/dagster dev -w workspace.yaml

clean-demo:
	rm -rf .pipeline .dagster_home
