# podguard developer entry points. `make run` and `make test` work on a fresh machine: they create
# .venv and install everything first. TORCH_SPEC pins the CPU build that this project's CI machines
# carry on disk; on a GPU host use e.g. `make run TORCH_SPEC=torch`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: install run test test-fast test-load lint fmt bench clean dist release-check

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)" -e '.[dev,torch,pods,image]'
	touch $(STAMP)

install: $(STAMP)

## the built-in demo training job (DDP on the GPUs, or 2 CPU processes with gloo when there is none)
run: $(STAMP)
	$(BIN)/podguard train

## the whole test suite (real processes, the real NVML binding against a fake libnvidia-ml.so.1), in TEST_WORKERS
## parallel pytest-xdist workers: most tests wait on processes, signals and sockets, not on the CPU; the image
## tests run after them in one process (one image build; docs/testing.md says why not xdist_group). TEST_WORKERS=0: one process, no xdist (docs/testing.md)
TEST_WORKERS ?= 4
PYTEST_PARALLEL = $(if $(filter 0,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS))
test: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_PARALLEL) -m "not docker"
	$(BIN)/python -m pytest -q -p no:xdist -m docker

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" $(PYTEST_PARALLEL)

## the timing-sensitive tests (`-m timing`: real processes, signals, deadlines) with HOGS busy-loop processes
## beside them, as on a busy laptop or CI runner; the hogs are killed however the run ends (docs/testing.md)
HOGS ?= 2
test-load: $(STAMP)
	HOGS=$(HOGS) PYTHON=$(BIN)/python tests/with_cpu_hogs.sh $(BIN)/python -m pytest -q -p no:xdist -m timing

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

fmt: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: $(STAMP)
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build dist *.egg-info entrypoint/*.egg-info

## the wheel and the sdist in dist/, checked the way PyPI checks them (twine check --strict). `python -m build`
## fetches setuptools into an isolated build environment; offline: make dist BUILD_FLAGS=--no-isolation
BUILD_FLAGS ?=
dist: $(STAMP)
	rm -rf dist
	$(BIN)/python -m build --outdir dist $(BUILD_FLAGS) .
	$(BIN)/twine check --strict dist/*

## before tagging a release (docs/development.md, "Releasing"): the version, its dated CHANGELOG section, an empty
## Unreleased section, dist/ of that version; TAG=vX.Y.Z checks the tag name too. The tag push does the rest.
TAG ?=
release-check: dist
	$(BIN)/python .github/scripts/release_check.py $(if $(TAG),--tag "$(TAG)") dist

## the container image (tini as PID 1, podguard as the entrypoint), built by `podguard image build` through
## the Docker SDK: the wheelhouse on the host first (docker/build-wheelhouse.sh), so the build itself needs
## no package index. Default base: the Dockerfile's CUDA `-base` image (torch's wheels bring the CUDA libraries).
##   make image                                              (CUDA base; TORCH_SPEC resolves the CUDA wheels there)
##   make image BASE_IMAGE=podguard-test-base:bookworm IMAGE=podguard-test:latest      (the tests' offline Debian base)
##   make image BASE_IMAGE=your-image TORCH_SPEC=base IMAGE=me/train:1   (your image's own Python and torch: +<=30 MB)
IMAGE ?= podguard:latest
BASE_IMAGE ?=

.PHONY: image image-smoke image-test

image: $(STAMP)
	$(BIN)/podguard image build --tag "$(IMAGE)" --torch "$(TORCH_SPEC)" $(if $(BASE_IMAGE),--base "$(BASE_IMAGE)")

## quick checks of a built image, timed: --version, doctor --json, the demo job, docker stop -> exit 143
image-smoke: $(STAMP)
	$(BIN)/podguard image smoke "$(IMAGE)"

## the image test suite on the real engine (builds the local base and podguard-test:latest, cached)
image-test: $(STAMP)
	$(BIN)/python -m pytest -q -m docker tests/image

## RunPod pods from a laptop (REST v2; RUNPOD_API_KEY or ~/.runpod/config.toml). SPEC picks the spec file:
##   make pod-up SPEC=runpod/pod.toml     (idempotent by name; waits until the pod's preflight passed)
SPEC ?= runpod/pod.toml
POD ?= $(shell sed -n 's/^name *= *"\(.*\)".*/\1/p' "$(SPEC)" | head -n 1)

.PHONY: pod-up pod-down pod-status pod-logs pod-heal pod-test

pod-up: $(STAMP)
	$(BIN)/podguard pod up --spec "$(SPEC)"

pod-down: $(STAMP)
	$(BIN)/podguard pod down "$(POD)"

pod-status: $(STAMP)
	$(BIN)/podguard pod status "$(POD)"

pod-logs: $(STAMP)
	$(BIN)/podguard pod logs "$(POD)" --follow

pod-heal: $(STAMP)
	$(BIN)/podguard pod heal "$(POD)"

## the pod tests: the real runpod SDK and podguard's REST client against the suite's stand-in API
pod-test: $(STAMP)
	$(BIN)/python -m pytest -q tests/pods
