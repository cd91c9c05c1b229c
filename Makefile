# One venv for everything; `make demo` and `make test` create it first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# Three workers on two cores: the suite waits more than it computes (its
# services, vendors and browsers pace themselves; CPU ~45 % busy on two
# workers), so a third fills the waits (quiet 2 cores, 2026-12-06: 542 s on
# two, 453-487 s on three, 456 s on four). A whole file at a time
# (module-scoped services and browsers stay in one process), in the order
# tests/conftest.py puts the files: the longest first. `make test
# PYTEST_PARALLEL=` runs serially.
PYTEST_PARALLEL ?= -n 3 --dist loadfile --no-loadscope-reorder

.PHONY: venv demo test unit lint typecheck bench clean

venv: $(STAMP)
	@$(BIN)/python -m dispatcher.accounts.browser_setup

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

demo: venv
	$(BIN)/python -m dispatcher demo-run

test: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q $(PYTEST_PARALLEL)

# The edit-run loop: tests/unit alone (no browser, no PostgreSQL, no service
# process), serially: ~20 s of CPU, where two workers would each pay the
# imports and collection again. A test that needs more moves to integration.
unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: venv
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
