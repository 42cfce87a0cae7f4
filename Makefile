# The two commands a new user runs: `make demo` and `make test`.
# Both create .venv with the system python3 when it is missing and install the project into it.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.refgrid-installed
DEMO_OUT ?= demo-output

.PHONY: demo test lint bench fixtures clean browser

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/refgrid demo fixtures --out $(DEMO_OUT)

test: $(STAMP) browser
	$(BIN)/ruff check src tests benchmarks fixtures
	$(BIN)/mypy
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[bench]"
	for b in benchmarks/[a-z]*.py; do $(BIN)/python $$b || exit 1; done

# Debian's chromium for the browser test of `refgrid serve`: installed when missing and we are
# root; otherwise that test is skipped with a message saying so.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	  && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium \
	  >/dev/null; } || echo "chromium is not installed: the browser test will be skipped"

fixtures: $(STAMP)
	$(BIN)/python fixtures/generate.py fixtures

clean:
	rm -rf $(VENV) $(DEMO_OUT) .pytest_cache .hypothesis
