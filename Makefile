# The two commands a new user runs: `make demo` and `make test`.
# Both create .venv with the system python3 when it is missing and install the project into it.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.refgrid-installed
DEMO_OUT ?= demo-output

.PHONY: demo test lint bench fixtures clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/refgrid demo fixtures --out $(DEMO_OUT)

test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks fixtures
	$(BIN)/mypy
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[bench]"
	for b in benchmarks/[a-z]*.py; do $(BIN)/python $$b || exit 1; done

fixtures: $(STAMP)
	$(BIN)/python fixtures/generate.py fixtures

clean:
	rm -rf $(VENV) $(DEMO_OUT) .pytest_cache .hypothesis
