# One place for the commands the README and CI use. Each target installs what it needs into
# .venv first, so they work on a fresh machine with nothing installed by hand.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test test-fast test-hosted lint bench gpu-evidence evidence-wheels browser-deps clean

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
# its own, and the pipeline's (torch.distributed.pipelining changed between the two: every
# pipeline failed on the pinned one while the suite passed on the newest). PyTorch's CPU index
# is tried once, briefly: where it cannot be reached, pip's other sources stand in for it (on
# this project's machines, a local file of that CPU build).
HOSTED_VENV := .venv-hosted
HOSTED_TESTS := tests/test_worker_warmup.py tests/test_hosting.py tests/test_engine.py \
	tests/test_cuda_rules.py tests/test_versions.py tests/test_symbolic.py tests/test_pipeline.py

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

# The real-GPU evidence in one call of the device tool (docs/development.md#the-evidence-run).
# No .venv and no install: on a lent GPU machine nothing can be fetched, and its python3 holds
# torch; the wheels it lacks travel in .whl/ (make evidence-wheels, here, first). DRY=1 runs
# every chunk on CPU with tiny models (tests/test_gpu_evidence.py runs it).
EVIDENCE_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
EVIDENCE_WHEELS := bitsandbytes==0.50.2 liger-kernel==0.8.5 torchao==0.18.0

gpu-evidence:  ## the real-GPU evidence run: OUT=dir [BUNDLE=file.tar.gz] [CHUNKS="loops peers"] [DRY=1]
	@test -n "$(OUT)" || { echo "usage: make gpu-evidence OUT=DIR [BUNDLE=FILE] [CHUNKS=...] [DRY=1]"; exit 2; }
	PYTHONPATH=.$${PYTHONPATH:+:$$PYTHONPATH} $(EVIDENCE_PYTHON) benchmarks/gpu_evidence.py \
	  --out $(OUT) $(if $(BUNDLE),--bundle $(BUNDLE)) $(if $(CHUNKS),--chunks $(CHUNKS)) $(if $(DRY),--dry)

# Wheels for the device's Python (3.12, x86-64, manylinux), as the device tool's README says.
evidence-wheels:  ## the wheels a GPU lease carries for make gpu-evidence, into .whl/
	$(EVIDENCE_PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
	  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
	  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
	  --platform manylinux2014_x86_64 -d .whl $(EVIDENCE_WHEELS)

# The browser test drives Debian's Chromium (a tool's own browser download fails offline).
browser-deps:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && apt-get install -y -qq chromium >/dev/null; \
	  else echo "chromium not found: the browser test will be skipped"; fi; }

clean:
	rm -rf $(VENV) $(HOSTED_VENV) .pytest_cache .ruff_cache
