"""Fixtures of the image tests: one image per session, built the way users build it, and containers that
are always removed.

The session build (`built`) runs, each step cached so a second session is fast:
1. the local base image `podguard-test-base:bookworm` (debootstrap + `docker import`; no registry is
   reachable on the CI machines): tests/image/support/build-base-image.sh;
2. `podguard image build` (the wheelhouse on the host, then the Dockerfile through the Docker SDK), tagged
   `podguard-test-<session>:latest` and untagged at the end (the layers stay as Docker's cache), with
   secret-looking variables in its environment and a source URL with a token, which
   test_image_layers.py then looks for in every layer and in `docker history`.

The `--torch base` build (`built_torch_base`, only for the tests that ask for it) builds the torch-bearing
base `podguard-test-torchbase:bookworm` on top of the first (tests/image/support/build-torch-base.sh: torch
from the host's wheels in a conda-style /opt/conda, first on PATH), then `podguard image build --torch base`
on it. `any_image` / `any_container` run a test on both images (the default one and the `--torch base` one).

`PODGUARD_TEST_IMAGE=IMAGE` tests an image that already exists instead (the build checks then skip).
Without a Docker engine these tests skip with the reason, except in CI (`CI=true`), where that fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from imagetools import (
    BASE_IMAGE,
    PODGUARD,
    ROOT,
    TEST_REPOSITORY,
    TORCH_BASE_IMAGE,
    BuiltImage,
    docker,
    engine_problem,
)


def _timed(name: str, cmd: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, **(env or {})})
    print(f"[image] {name}: {time.monotonic() - start:.1f} s", file=sys.stderr)
    if proc.returncode != 0:
        pytest.fail(f"{name} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}")
    return proc


@pytest.fixture(scope="session")
def engine() -> None:
    problem = engine_problem()
    if problem:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but the image tests cannot run: {problem} (.ci/run starts dockerd)")
        pytest.skip(f"{problem}; start dockerd to run the image tests")


@pytest.fixture(scope="session")
def built(engine: None) -> Iterator[BuiltImage]:
    wanted = os.environ.get("PODGUARD_TEST_IMAGE")
    if wanted:
        if docker("image", "inspect", wanted).returncode != 0:
            pytest.fail(f"PODGUARD_TEST_IMAGE={wanted} does not exist: build it first (`make image`)")
        yield BuiltImage(wanted, None, "", (), "")
        return
    _timed("base image", [str(ROOT / "tests/image/support/build-base-image.sh"), BASE_IMAGE])
    marker = uuid.uuid4().hex
    secrets = (f"rpa_{marker}RUNPODKEY", f"hf_{marker}HFTOKEN", f"aws{marker}SECRET", f"git{marker}TOKEN")
    source = f"https://builder:{secrets[3]}@git.example.invalid/podguard.git"
    env = {"RUNPOD_API_KEY": secrets[0], "HF_TOKEN": secrets[1], "AWS_SECRET_ACCESS_KEY": secrets[2]}
    # A repository of this session's own: sessions running at once on one engine never move each other's
    # tags. Docker's layer cache is by content, so a second session still builds from cache.
    tag = f"{TEST_REPOSITORY}-{marker[:8]}:latest"
    args = ["image", "build", "--base", BASE_IMAGE, "--torch", "torch==2.13.0", "--tag", tag]
    proc = _timed("podguard image build", [PODGUARD, *args, "--source", source, "--json"], env)
    result = json.loads(proc.stdout)
    yield BuiltImage(tag, result, proc.stderr, secrets, source)
    # Untag; --no-prune keeps the parent layers, which are the next session's build cache.
    docker("rmi", "--no-prune", *result["tags"], timeout=300)


@pytest.fixture(scope="session")
def image(built: BuiltImage) -> str:
    return built.tag


@pytest.fixture(scope="session")
def torch_base(engine: None) -> str:
    """The torch-bearing base (the tests' Debian base + torch in /opt/conda), built once and cached."""
    _timed("base image", [str(ROOT / "tests/image/support/build-base-image.sh"), BASE_IMAGE])
    script = ROOT / "tests/image/support/build-torch-base.sh"
    _timed("torch base image", [str(script), TORCH_BASE_IMAGE, BASE_IMAGE], {"PIP": f"{sys.executable} -m pip"})
    return TORCH_BASE_IMAGE


@pytest.fixture(scope="session")
def built_torch_base(torch_base: str) -> Iterator[BuiltImage]:
    """`podguard image build --base <torch base> --torch base`, once per session."""
    tag = f"{TEST_REPOSITORY}-tb-{uuid.uuid4().hex[:8]}:latest"
    args = ["image", "build", "--base", torch_base, "--torch", "base", "--tag", tag, "--json"]
    proc = _timed("podguard image build --torch base", [PODGUARD, *args])
    result = json.loads(proc.stdout)
    yield BuiltImage(tag, result, proc.stderr, (), "")
    docker("rmi", "--no-prune", *result["tags"], timeout=300)


@pytest.fixture(scope="session")
def torch_base_image(built_torch_base: BuiltImage) -> str:
    return built_torch_base.tag


@pytest.fixture(params=["default", "torch-base"])
def any_image(request: pytest.FixtureRequest) -> str:
    """The test runs on the default image and on the `--torch base` one."""
    return request.getfixturevalue("image" if request.param == "default" else "torch_base_image")


@pytest.fixture
def container(image: str) -> Iterator[Callable[..., str]]:
    """`start(*IMAGE_ARGS, opts=[docker run options])` -> container id; every one is removed afterwards."""
    yield from _containers(image)


@pytest.fixture
def any_container(any_image: str) -> Iterator[Callable[..., str]]:
    """`container` on each of the two images (see `any_image`)."""
    yield from _containers(any_image)


def _containers(image: str) -> Iterator[Callable[..., str]]:
    started: list[str] = []

    def start(*args: str, opts: list[str] | tuple[str, ...] = ()) -> str:
        proc = docker("run", "-d", "--shm-size=1g", *opts, image, *args, timeout=60)
        assert proc.returncode == 0, proc.stderr
        started.append(proc.stdout.strip())
        return started[-1]

    yield start
    for cid in started:
        docker("rm", "-f", cid, timeout=60)


@pytest.fixture
def volume(engine: None) -> Iterator[str]:
    """A fresh named volume, removed afterwards."""
    name = f"podguard-test-{uuid.uuid4().hex[:10]}"
    docker("volume", "create", name, check=True)
    yield name
    users = docker("ps", "-aq", "--filter", f"volume={name}").stdout.split()
    if users:  # the test's containers may still exist: fixtures are torn down in reverse order
        docker("rm", "-f", *users, timeout=60)
    docker("volume", "rm", "-f", name, timeout=60)
