# The two commands a new user runs: `make demo` and `make test`.
# Both create .venv with the newest Python >= 3.11 found (3.13, then 3.12, then python3; pyenv's
# versions are looked at too) and install the project into it; `make test PYTHON=python3.12`
# picks another, and the venv is made anew whenever PYTHON names another interpreter.
PYENV_ROOT := $(shell pyenv root 2>/dev/null)
CANDIDATES := $(wildcard $(PYENV_ROOT)/versions/3.13*/bin/python3.13) python3.13 \
              $(wildcard $(PYENV_ROOT)/versions/3.12*/bin/python3.12) python3.12 python3
OLDEST_CANDIDATES := $(wildcard $(PYENV_ROOT)/versions/3.11*/bin/python3.11) python3.11 python3
# the first candidate that runs, is >= 3.11 and has venv
first_python = $(shell for p in $(1); do "$$p" -c 'import sys, venv; \
  sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1 && { echo "$$p"; break; }; done)
PYTHON ?= $(call first_python,$(CANDIDATES))
OLDEST_PYTHON ?= $(call first_python,$(OLDEST_CANDIDATES))
VENV   ?= .venv
BIN    := $(VENV)/bin
CORE   := $(VENV)/.refgrid-core
STAMP  := $(VENV)/.refgrid-installed
OLDEST := .venv-oldest
DEMO_OUT ?= demo-output
# the suite's worker processes (pytest-xdist): CI has two cores; `make test WORKERS=0` runs it
# in one process (a debugger, or output in order)
WORKERS ?= 2

.PHONY: demo test test-oldest lint bench fixtures clean browser ncdump python FORCE

# which interpreter `make demo` / `make test` would use
python:
	@echo "$(PYTHON)"

# The interpreter the venv was made with; a different PYTHON makes the venv anew.
$(VENV)/.python: FORCE
	@test -n "$(PYTHON)" || { echo "no Python >= 3.11 with venv found: install one or pass PYTHON=..."; exit 1; }
	@want="$$("$(PYTHON)" -c 'import sys; print(sys.executable)')"; \
	if [ "$$(cat $@ 2>/dev/null)" != "$$want" ]; then \
	  echo "making $(VENV) with $$want"; rm -rf $(VENV); \
	  "$(PYTHON)" -m venv $(VENV) && echo "$$want" > $@; \
	fi

# the demo needs the core install only (no extras); the suite needs the test extra
$(CORE): $(VENV)/.python pyproject.toml
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	touch $(CORE)

$(STAMP): $(VENV)/.python pyproject.toml
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(STAMP) $(CORE)

demo: $(CORE)
	$(BIN)/refgrid demo fixtures --out $(DEMO_OUT)

test: $(STAMP) browser ncdump
	$(BIN)/ruff check src tests benchmarks fixtures
	$(BIN)/mypy
	$(BIN)/python -m pytest -n $(WORKERS) --dist worksteal

# The oldest supported stack: Python 3.11 with zarr 3.1 and Icechunk 1 (what pip resolves
# there), the type checker and the suite (.ci/run runs it after `make test`).
$(OLDEST)/.refgrid-installed: pyproject.toml
	@test -n "$(OLDEST_PYTHON)" || { echo "no Python 3.11 found: pass OLDEST_PYTHON=..."; exit 1; }
	rm -rf $(OLDEST)
	"$(OLDEST_PYTHON)" -m venv $(OLDEST)
	$(OLDEST)/bin/python -m pip install --quiet --upgrade pip
	$(OLDEST)/bin/python -m pip install --quiet -e ".[test]"
	touch $@

test-oldest: $(OLDEST)/.refgrid-installed browser ncdump
	$(OLDEST)/bin/python -c 'import sys, zarr; print("oldest stack: Python", sys.version.split()[0], "zarr", zarr.__version__)'
	$(OLDEST)/bin/mypy
	$(OLDEST)/bin/python -m pytest -n $(WORKERS) --dist worksteal

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[bench]"
	for b in benchmarks/[a-z]*.py; do $(BIN)/python $$b || exit 1; done

# Debian's chromium for the browser test of `refgrid serve`: installed when missing and we are
# root; otherwise that test is skipped with a message saying so.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	  && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium \
	  >/dev/null; } || echo "chromium is not installed: the browser test will be skipped"

# Debian's netcdf-bin for the ncdump test of the OPeNDAP endpoints: installed when missing and
# we are root; otherwise that test is skipped with a message saying so.
ncdump:
	@command -v ncdump >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	  && { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq netcdf-bin >/dev/null 2>&1 || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq netcdf-bin >/dev/null; }; }; } \
	  || echo "netcdf-bin is not installed: the ncdump test will be skipped"

fixtures: $(STAMP)
	$(BIN)/python fixtures/generate.py fixtures

clean:
	rm -rf $(VENV) $(OLDEST) $(DEMO_OUT) .pytest_cache .hypothesis
