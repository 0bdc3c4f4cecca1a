# podguard developer entry points. `make run` and `make test` work on a fresh machine: they create
# .venv and install everything first. TORCH_SPEC pins the CPU build that this project's CI machines
# carry on disk; on a GPU host use e.g. `make run TORCH_SPEC=torch`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: install run test test-fast lint fmt bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)" -e '.[dev,torch]'
	touch $(STAMP)

install: $(STAMP)

## the built-in demo training job (DDP on the GPUs, or 2 CPU processes with gloo when there is none)
run: $(STAMP)
	$(BIN)/podguard train

## the whole test suite (real processes, the real NVML binding against a fake libnvidia-ml.so.1)
test: $(STAMP)
	$(BIN)/python -m pytest -q

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

fmt: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: $(STAMP)
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info
