# One place for the commands the README and CI use. Each target installs what it needs into
# .venv first, so they work on a fresh machine with nothing installed by hand.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test test-fast test-hosted lint bench browser-deps clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The package itself goes in editable, without its dependencies (the requirements files pin
# them): the set-up then leaves the `memorymark` command in .venv/bin, running this checkout.
$(VENV)/.app-installed: requirements.txt pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -r requirements.txt
	$(BIN)/pip install -q --no-deps -e .
	touch $@

# The tests' extras go on top of the app's install, never beside it: requirements-dev.txt names
# no torch, so `make test` runs on the very torch `make run` installed (the one a new user gets)
# and never replaces it.
$(VENV)/.dev-installed: $(VENV)/.app-installed requirements-dev.txt
	$(BIN)/pip install -q -r requirements-dev.txt
	touch $@

run: $(VENV)/.app-installed  ## the app on http://localhost:8501
	$(BIN)/streamlit run app.py

test: $(VENV)/.dev-installed browser-deps  ## the whole test suite, browser test included
	$(BIN)/python -c 'import torch; print("torch", torch.__version__)'
	$(BIN)/python -m pytest

# The files marked `fast` (pytestmark = pytest.mark.fast): at least one per package of
# memorymark/, which tests/test_fast_subset.py checks, in under two minutes on 2 cores.
test-fast: $(VENV)/.dev-installed  ## a quick subset touching every package, for while you work
	$(BIN)/python -m pytest -m fast

# A hosted server installs PyTorch's CPU build of the release hosted/requirements.txt pins, not
# the newest: the tests of the worker pool, the engine and hosting run on it too, in a venv of
# its own. PyTorch's CPU index is tried once, briefly: where it cannot be reached, pip's other
# sources stand in for it (on this project's machines, a local file of that CPU build).
HOSTED_VENV := .venv-hosted
HOSTED_TESTS := tests/test_worker_warmup.py tests/test_hosting.py tests/test_engine.py \
	tests/test_cuda_rules.py tests/test_versions.py tests/test_symbolic.py

$(HOSTED_VENV)/.installed: hosted/requirements.txt requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(HOSTED_VENV)
	cd hosted && PIP_RETRIES=0 PIP_TIMEOUT=10 PIP_DEFAULT_TIMEOUT=10 ../$(HOSTED_VENV)/bin/pip install -q \
	  -r requirements.txt -r ../requirements-dev.txt
	$(HOSTED_VENV)/bin/pip install -q --no-deps -e .
	touch $@

test-hosted: $(HOSTED_VENV)/.installed  ## the hosted torch's tests (worker pool, engine, hosting)
	$(HOSTED_VENV)/bin/python -c 'import torch; print("torch", torch.__version__)'
	$(HOSTED_VENV)/bin/python -m pytest -p no:cacheprovider $(HOSTED_TESTS)

lint: $(VENV)/.dev-installed  ## ruff, and mypy over the package (pyproject.toml's [tool.mypy])
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

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
	rm -rf $(VENV) $(HOSTED_VENV) .pytest_cache .ruff_cache
