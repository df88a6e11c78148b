# One place for the commands the README and CI use. Each target installs what it needs into
# .venv first, so they work on a fresh machine with nothing installed by hand.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test lint bench browser-deps clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The package itself goes in editable, without its dependencies (the requirements files pin
# them): the set-up then leaves the `memorymark` command in .venv/bin, running this checkout.
$(VENV)/.app-installed: requirements.txt pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -r requirements.txt
	$(BIN)/pip install -q --no-deps -e .
	touch $@

$(VENV)/.dev-installed: requirements.txt requirements-dev.txt pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -r requirements-dev.txt
	$(BIN)/pip install -q --no-deps -e .
	touch $@ $(VENV)/.app-installed

run: $(VENV)/.app-installed  ## the app on http://localhost:8501
	$(BIN)/streamlit run app.py

test: $(VENV)/.dev-installed browser-deps  ## the whole test suite, browser test included
	$(BIN)/python -m pytest

lint: $(VENV)/.dev-installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: $(VENV)/.dev-installed  ## prints the figures the README and closing notes quote
	PYTHONPATH=. $(BIN)/python benchmarks/sweep_cost.py
	PYTHONPATH=. $(BIN)/python benchmarks/cuda_rules.py
	PYTHONPATH=. $(BIN)/python benchmarks/big_models.py
	PYTHONPATH=. $(BIN)/python benchmarks/published.py

# The browser test drives Debian's Chromium (a tool's own browser download fails offline).
browser-deps:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && apt-get install -y -qq chromium >/dev/null; \
	  else echo "chromium not found: the browser test will be skipped"; fi; }

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
