"""Helpers for the image tests: the docker CLI as a subprocess, log/exec polling, the fake GPU node's mounts.

The tests drive the engine the way a person does (the `docker` CLI and `podguard image ...` as processes);
the SDK is used only where the CLI has no equivalent (reading a container's attributes is the same data).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fakenvml import NvmlNode

ROOT = Path(__file__).resolve().parents[2]
BASE_IMAGE = os.environ.get("PODGUARD_TEST_BASE_IMAGE", "podguard-test-base:bookworm")
# BASE_IMAGE + torch in a conda-style /opt/conda first on PATH (tests/image/support/build-torch-base.sh)
TORCH_BASE_IMAGE = "podguard-test-torchbase:bookworm"
TEST_REPOSITORY = "podguard-test"  # + "-<session>": the version tags a test build gets never move podguard:*
PODGUARD = str(Path(sys.executable).with_name("podguard"))
FAKENVML_DIR = ROOT / "tests" / "fakenvml"
# Where the NVIDIA container toolkit puts the driver's NVML library in a container (Debian/Ubuntu multiarch).
NVML_IN_CONTAINER = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
NODE_IN_CONTAINER = "/fakenode"


@dataclass(frozen=True)
class BuiltImage:
    """The session's image (tests/image/conftest.py)."""

    tag: str
    result: dict | None  # `podguard image build --json` output; None for PODGUARD_TEST_IMAGE
    progress: str  # what the build printed on stderr
    secrets: tuple[str, ...]  # values that were in the build's environment and must be in no layer
    source: str  # the --source URL given (with a token in it)


def docker(*args: str, timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return proc


def podguard(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`podguard ...` as a separate process (the CLI as users run it)."""
    return subprocess.run(
        [PODGUARD, *args], capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}, cwd=ROOT
    )


def engine_problem() -> str | None:
    """None when a Docker engine answers, else why not."""
    try:
        info = docker("info", "--format", "{{.ServerVersion}}", timeout=30)
    except FileNotFoundError:
        return "no `docker` client on PATH"
    except subprocess.TimeoutExpired:
        return "`docker info` did not answer within 30 s"
    if info.returncode != 0:
        return f"no Docker engine: `docker info` failed: {(info.stderr or info.stdout).strip()[-300:]}"
    return None


def logs(cid: str) -> str:
    proc = docker("logs", cid, timeout=30)
    return proc.stdout + proc.stderr


def state(cid: str, field: str = "Status") -> str:
    return docker("inspect", "-f", "{{.State." + field + "}}", cid).stdout.strip()


def wait_for(predicate, what: str, deadline_s: float = 60, cid: str | None = None):  # type: ignore[no-untyped-def]
    """Poll `predicate()` every 0.2 s until it returns something truthy (returned); fail naming `what`."""
    deadline = time.monotonic() + deadline_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            tail = f"\ncontainer output:\n{logs(cid)[-3000:]}" if cid else ""
            raise AssertionError(f"timed out after {deadline_s:.0f} s waiting for {what}{tail}")
        time.sleep(0.2)


def wait_for_log(cid: str, needle: str, deadline_s: float = 60, count: int = 1) -> str:
    """Wait until `needle` appears `count` times in the container's output; fail early if it stopped."""

    def found() -> str | None:
        out = logs(cid)
        if out.count(needle) >= count:
            return out
        if state(cid) not in ("running", "restarting", "created"):
            raise AssertionError(f"{needle!r} x{count} not in the output and the container stopped:\n{out[-3000:]}")
        return None

    return wait_for(found, f"{needle!r} in the output", deadline_s, cid)


def wait_exited(cid: str, deadline_s: float = 120) -> int:
    wait_for(lambda: state(cid) == "exited", "the container to exit", deadline_s, cid)
    return int(state(cid, "ExitCode"))


def proc_table(cid: str) -> list[tuple[int, str, str, str]]:
    """(pid, comm, state, cmdline) of every process in the container, from its /proc."""
    script = 'for d in /proc/[0-9]*; do s=$(cat "$d/stat" 2>/dev/null) && echo "$s|$(tr "\\0" " " <"$d/cmdline")"; done'
    proc = docker("exec", cid, "sh", "-c", script, timeout=30, check=True)
    out = []
    for line in proc.stdout.splitlines():
        m = re.match(r"(\d+) \((.*)\) (\S) .*\|(.*)$", line)
        if m and m.group(2) != "sh":  # not the `docker exec` shell itself
            out.append((int(m.group(1)), m.group(2), m.group(3), m.group(4).strip()))
    return out


def fake_gpu_args(node: NvmlNode) -> list[str]:
    """`docker run` arguments that give a container the fake GPU node, where a real node's files would be:
    the fake libnvidia-ml.so.1 where the NVIDIA toolkit mounts the driver's, the device files in /dev, and
    the node folder (scenario + registry; the scenario is replaced by rename, so the folder is mounted)."""
    args = ["-v", f"{node.library}:{NVML_IN_CONTAINER}:ro", "-v", f"{node.root}:{NODE_IN_CONTAINER}"]
    for path in sorted(node.dev_dir.iterdir()):
        args += ["-v", f"{path}:/dev/{path.name}"]
    return [
        *args,
        "-v",
        f"{FAKENVML_DIR}:/fakenvml:ro",
        "-e",
        f"FAKE_NVML_SCENARIO={NODE_IN_CONTAINER}/scenario.txt",
        "-e",
        f"FAKE_NVML_PROCS_DIR={NODE_IN_CONTAINER}/procs",
    ]


def holder_command(gpu: int, mem_mib: int, ready: str, *extra: str) -> list[str]:
    """A stand-in CUDA process (tests/fakenvml/gpuproc.py) run inside the container."""
    return [
        "python3",
        "-S",
        "-E",
        "/fakenvml/gpuproc.py",
        f"--gpu={gpu}",
        f"--mem-mib={mem_mib}",
        "--dev-dir=/dev",
        f"--procs-dir={NODE_IN_CONTAINER}/procs",
        f"--ready-file={ready}",
        *extra,
    ]
