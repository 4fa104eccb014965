# Slipstream: the two commands a new user needs are `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PYTHONPATH := $(CURDIR):$(CURDIR)/plugins
export SLIPSTREAM_HOME ?= $(CURDIR)/.slipstream
# pyspark 4 and the trainer are happiest with a quiet, predictable environment
export PYSPARK_PYTHON := $(CURDIR)/$(VENV)/bin/python
export TOKENIZERS_PARALLELISM := false

.PHONY: venv demo test test-unit test-integration lint lint-imports ui ui-stop stack-up stack-down bench clean check-java

check-java:
	@command -v java >/dev/null 2>&1 || { echo "Java 17 is required for Spark and was not found on PATH."; \
	  echo "Install it, e.g. 'sudo apt-get install -y openjdk-17-jre-headless' (Debian/Ubuntu)"; \
	  echo "or 'brew install openjdk@17' (macOS), then run this command again."; exit 1; }
	@java -version 2>&1 | grep -qE 'version "(1[7-9]|2[0-9])' || { echo "Spark needs Java 17 or newer; found:"; java -version; exit 1; }

$(STAMP): requirements.txt pyproject.toml slipstream/samples/native/ragged.c
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	@# torchrec depends on fbgemm-gpu (the CUDA build), which installs the same `fbgemm_gpu` package as
	@# fbgemm-gpu-cpu and does not load without NVIDIA's driver: on CPU the CPU build must own it
	@if ! $(PY) -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then \
	  $(PY) -m pip uninstall -q -y fbgemm-gpu; \
	  $(PY) -m pip install -q --no-deps --force-reinstall $$(grep -E '^fbgemm-gpu-cpu==' requirements.txt); fi
	$(PY) -m pip install -q --no-deps -e .
	@# the loader's native kernels (optional: without a C compiler the loader uses Arrow's take and numpy)
	-$(PY) -m slipstream.samples.native
	@touch $(STAMP)

venv: $(STAMP)

demo: check-java $(STAMP)
	$(VENV)/bin/slipstream demo

# the layering (import-linter), the linter (ruff) and the type checker (mypy, strict): any finding fails
lint: $(STAMP)
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

test: check-java lint
	$(PY) -m pytest $(PYTEST_ARGS)

test-unit: $(STAMP)
	$(PY) -m pytest -m "not integration" $(PYTEST_ARGS)

test-integration: check-java $(STAMP)
	$(PY) -m pytest -m integration $(PYTEST_ARGS)

lint-imports: $(STAMP)
	$(VENV)/bin/lint-imports

stack-up: $(STAMP)
	$(VENV)/bin/slipstream stack up

stack-down: $(STAMP)
	$(VENV)/bin/slipstream stack down

ui: check-java $(STAMP)
	$(VENV)/bin/slipstream ui up

ui-stop: $(STAMP)
	$(VENV)/bin/slipstream ui down

clean:
	-$(VENV)/bin/slipstream stack down
	rm -rf .slipstream
