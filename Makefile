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
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)" -e '.[dev,torch,pods,image]'
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

## the container image (tini as PID 1, podguard as the entrypoint). The wheelhouse is built on the host
## first (docker/build-wheelhouse.sh), so the build needs no package index. For a real CUDA image:
##   make image TORCH_SPEC=torch IMAGE_PYTHON=3.12            (default base: CUDA on Ubuntu 24.04, Python 3.12)
## Offline, on the local Debian base the tests build (tests/image/support/build-base-image.sh):
##   make image BASE_IMAGE=podguard-test-base:bookworm       (Python 3.11, no openssh-server: no apt needed)
IMAGE ?= podguard:latest
BASE_IMAGE ?= nvidia/cuda:12.6.3-cudnn-runtime-ubuntu24.04
IMAGE_PYTHON ?= $(if $(findstring bookworm,$(BASE_IMAGE)),3.11,3.12)
EXTRA_APT_PACKAGES ?= $(if $(findstring podguard-test-base,$(BASE_IMAGE)),,openssh-server)

.PHONY: image image-smoke

image: $(STAMP)
	PIP="$(BIN)/python -m pip" TORCH_SPEC="$(TORCH_SPEC)" IMAGE_PYTHON="$(IMAGE_PYTHON)" docker/build-wheelhouse.sh
	docker build --build-arg BASE_IMAGE="$(BASE_IMAGE)" --build-arg EXTRA_APT_PACKAGES="$(EXTRA_APT_PACKAGES)" -t $(IMAGE) .

## quick checks of a built image: --version, doctor, the demo job on CPU, SIGTERM forwarding / reaping
image-smoke: $(STAMP)
	PODGUARD_TEST_IMAGE=$(IMAGE) $(BIN)/python -m pytest -q -m docker tests/test_image.py -k smoke
