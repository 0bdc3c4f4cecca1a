"""The container image, built and run with a real Docker engine.

The session fixture builds everything the image needs, each step cached so a second run is fast:
1. the local base image `podguard-test-base:bookworm` (debootstrap + `docker import`; no registry is
   reachable on the CI machines): tests/image/support/build-base-image.sh;
2. the wheelhouse (podguard + its dependencies + the CPU torch, built on the host):
   docker/build-wheelhouse.sh;
3. `docker build` of the repo's Dockerfile on that base (Docker's layer cache keeps torch's layer).

`PODGUARD_TEST_IMAGE=IMAGE` skips the build and tests an image that already exists (`make image-smoke`).

Without a Docker engine these tests skip with the reason, except in CI (`CI=true`), where that is a failure.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BASE_IMAGE = os.environ.get("PODGUARD_TEST_BASE_IMAGE", "podguard-test-base:bookworm")
TEST_IMAGE = "podguard:test"
SLEEPER = "import time; print('WORKER UP', flush=True); time.sleep(600)"


def _docker(*args: str, timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=check)


def _engine_problem() -> str | None:
    """None when a Docker engine answers, else why not."""
    if shutil.which("docker") is None:
        return "no `docker` client on PATH"
    try:
        info = _docker("info", "--format", "{{.ServerVersion}}", timeout=30)
    except subprocess.TimeoutExpired:
        return "`docker info` did not answer within 30 s"
    if info.returncode != 0:
        return f"no Docker engine: `docker info` failed: {(info.stderr or info.stdout).strip()[-300:]}"
    return None


def _run_step(name: str, cmd: list[str], env: dict[str, str] | None = None, timeout: float = 600) -> float:
    start = time.monotonic()
    proc = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )
    elapsed = time.monotonic() - start
    if proc.returncode != 0:
        pytest.fail(f"{name} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    print(f"[image] {name}: {elapsed:.1f} s", file=sys.stderr)
    return elapsed


@pytest.fixture(scope="session")
def image() -> str:
    problem = _engine_problem()
    if problem:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but the image tests cannot run: {problem} (.ci/run starts dockerd)")
        pytest.skip(f"{problem}; start dockerd to run the image tests")
    wanted = os.environ.get("PODGUARD_TEST_IMAGE")
    if wanted:
        if _docker("image", "inspect", wanted).returncode != 0:
            pytest.fail(f"PODGUARD_TEST_IMAGE={wanted} does not exist: build it first (`make image`)")
        return wanted
    _run_step("base image", [str(ROOT / "tests/image/support/build-base-image.sh"), BASE_IMAGE])
    _run_step(
        "wheelhouse",
        [str(ROOT / "docker/build-wheelhouse.sh")],
        env={"PIP": f"{sys.executable} -m pip", "IMAGE_PYTHON": "3.11", "TORCH_SPEC": "torch==2.13.0"},
    )
    _run_step(
        "docker build",
        [
            "docker",
            "build",
            "-q",
            "--build-arg",
            f"BASE_IMAGE={BASE_IMAGE}",
            "--build-arg",
            "EXTRA_APT_PACKAGES=",
            "-t",
            TEST_IMAGE,
            ".",
        ],
    )
    return TEST_IMAGE


@pytest.fixture
def container(image: str):
    """Start detached containers of the image (`start(*ARGS)`); every one is removed at the end of the test."""
    started: list[str] = []

    def start(*args: str) -> str:
        proc = _docker("run", "-d", "--shm-size=1g", image, *args, timeout=60)
        assert proc.returncode == 0, proc.stderr
        cid = proc.stdout.strip()
        started.append(cid)
        return cid

    yield start
    for cid in started:
        _docker("rm", "-f", cid, timeout=60)


def _logs(cid: str) -> str:
    proc = _docker("logs", cid, timeout=30)
    return proc.stdout + proc.stderr


def _wait_for_log(cid: str, needle: str, deadline_s: float = 60) -> str:
    deadline = time.monotonic() + deadline_s
    while True:
        logs = _logs(cid)
        if needle in logs:
            return logs
        state = _docker("inspect", "-f", "{{.State.Running}}", cid).stdout.strip()
        if state != "true" or time.monotonic() > deadline:
            pytest.fail(f"{needle!r} not in the container's output (running={state}):\n{logs[-3000:]}")
        time.sleep(0.2)


def _proc_states(cid: str) -> list[tuple[int, str, str, str]]:
    """(pid, comm, state, cmdline) of every process in the container, read from its /proc."""
    script = 'for d in /proc/[0-9]*; do s=$(cat "$d/stat" 2>/dev/null) && echo "$s|$(tr "\\0" " " <"$d/cmdline")"; done'
    proc = _docker("exec", cid, "sh", "-c", script, timeout=30)
    assert proc.returncode == 0, proc.stderr
    out = []
    for line in proc.stdout.splitlines():
        m = re.match(r"(\d+) \((.*)\) (\S) .*\|(.*)$", line)
        if m and m.group(2) != "sh":  # not the `docker exec` shell itself
            out.append((int(m.group(1)), m.group(2), m.group(3), m.group(4).strip()))
    return out


# -- smoke (make image-smoke): version, doctor, the demo job, signals --------------------------------


def test_smoke_version_and_doctor(image: str) -> None:
    version = _docker("run", "--rm", image, "--version")
    assert version.returncode == 0, version.stderr
    assert re.search(r"podguard \d+\.\d+", version.stdout), version.stdout

    doctor = _docker("run", "--rm", image, "doctor")
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    out = doctor.stdout + doctor.stderr
    assert "CPU only" in out, out
    assert "PID 1 tini" in out, out


def test_smoke_demo_train_on_cpu(image: str) -> None:
    proc = _docker("run", "--rm", "--shm-size=1g", image, "train", timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "DONE" in out, out[-4000:]
    assert "CPU" in out  # the loud CPU-fallback warning: no libnvidia-ml.so.1 in the image


def test_smoke_no_arguments_runs_the_default_command(image: str) -> None:
    proc = _docker("run", "--rm", "-e", "PODGUARD_DEFAULT_CMD=podguard --version", image)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("podguard "), proc.stdout


def test_smoke_stop_forwards_sigterm_and_reaps(container) -> None:
    # The worker leaves an orphan (a backgrounded sleep whose shell exited): it is reparented to podguard,
    # the subreaper, which must reap it when it exits. No zombie may be left in the container.
    worker = "import os, time; os.system('sleep 0.3 &'); print('WORKER UP', flush=True); time.sleep(600)"
    cid = container("train", "--", "python", "-c", worker)
    _wait_for_log(cid, "WORKER UP")

    deadline = time.monotonic() + 20
    while True:
        states = _proc_states(cid)
        orphan = [s for s in states if s[1] == "sleep"]
        zombies = [s for s in states if s[2] == "Z"]
        if not orphan and not zombies:
            break
        assert time.monotonic() < deadline, f"orphan not reaped (zombies: {zombies}): {states}"
        time.sleep(0.2)
    assert any(pid == 1 and comm == "tini" for pid, comm, _, _ in states), states
    assert any(comm.startswith("python") for _, comm, _, _ in states), states  # the worker is still running

    start = time.monotonic()
    stop = _docker("stop", "-t", "10", cid, timeout=60)
    took = time.monotonic() - start
    assert stop.returncode == 0, stop.stderr
    assert took < 6, f"docker stop took {took:.1f} s: SIGTERM was not forwarded (SIGKILL after 10 s)"
    exit_code = _docker("inspect", "-f", "{{.State.ExitCode}}", cid).stdout.strip()
    logs = _logs(cid)
    assert exit_code == "143", f"exit {exit_code}\n{logs[-3000:]}"
    assert "SIGTERM" in logs, logs[-3000:]


# -- the rest: RunPod start commands, bad input, PID 1 reaping outside podguard ------------------------


def test_runpod_style_start_command(image: str) -> None:
    proc = _docker("run", "--rm", image, "bash", "-c", "podguard run -- echo hello")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "hello" in proc.stdout.splitlines(), proc.stdout


def test_other_commands_run_as_is(image: str) -> None:
    proc = _docker("run", "--rm", image, "python", "-c", "import os, sys; print(os.getcwd(), sys.version_info[:2])")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().startswith("/workspace (3, "), proc.stdout


def test_bad_input_exits_64_with_one_line(image: str) -> None:
    proc = _docker("run", "--rm", image, "train", "--mode", "warp", "--", "true")
    assert proc.returncode == 64, proc.stdout + proc.stderr
    err_lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert len(err_lines) == 1, err_lines
    assert "warp" in err_lines[0], err_lines


def test_pid1_reaps_orphans_of_a_plain_command(container) -> None:
    # Without an init, an orphan's zombie would stay forever (PID 1 here would be `sleep`, which never
    # waits). tini reaps it. The shell backgrounds `sleep 0.3` and exits; bash then exec's the long sleep.
    cid = container("bash", "-c", "sh -c 'sleep 0.3 &'; echo WORKER UP; exec sleep 600")
    _wait_for_log(cid, "WORKER UP")
    deadline = time.monotonic() + 20
    while True:
        states = _proc_states(cid)
        leftovers = [s for s in states if s[1] == "sleep" and s[3] != "sleep 600"]  # the orphan, or its zombie
        zombies = [s for s in states if s[2] == "Z"]
        if not leftovers and not zombies:
            break
        assert time.monotonic() < deadline, f"orphan not reaped by PID 1 (zombies: {zombies}): {states}"
        time.sleep(0.2)
    assert any(cmd == "sleep 600" for _, _, _, cmd in states), states
    stop = _docker("stop", "-t", "10", cid, timeout=60)
    assert stop.returncode == 0
    assert _docker("inspect", "-f", "{{.State.ExitCode}}", cid).stdout.strip() == "143"
