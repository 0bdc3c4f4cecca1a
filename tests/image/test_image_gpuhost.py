"""`podguard image run` on a Docker GPU host: device requests, and the containers that already hold the GPUs.

The CI machines have no GPU, so this module starts a second, private Docker engine set up the way the
NVIDIA container toolkit sets one up: an `nvidia` runtime registered (an alias of runc) and an
`nvidia-container-runtime-hook` on the engine's PATH, which is what makes the engine accept `--gpus`
device requests. The hook here is a stand-in that injects no device (the engine itself still turns the
request into NVIDIA_VISIBLE_DEVICES in the container, as with the real toolkit). The engine has no network
bridge and its own data root, sockets and containerd, under a temporary folder removed afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from imagetools import BASE_IMAGE, docker, podguard, wait_for

pytestmark = [pytest.mark.docker, pytest.mark.slow]

# A stand-in for the NVIDIA container toolkit's prestart hook: reads the OCI state, adds nothing.
HOOK = "#!/bin/sh\ncat >/dev/null\n"


class GpuEngine:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.host = f"unix://{folder / 'docker.sock'}"
        self.env = {"DOCKER_HOST": self.host}

    def docker(self, *args: str, check: bool = False, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return docker("-H", self.host, *args, check=check, timeout=timeout)

    def inspect(self, name: str) -> dict:
        return json.loads(self.docker("inspect", name, check=True).stdout)[0]


@pytest.fixture(scope="module")
def gpu_engine(image: str) -> Iterator[GpuEngine]:
    runc = shutil.which("runc") or "/usr/sbin/runc"
    driver = docker("info", "--format", "{{.Driver}}", check=True).stdout.strip() or "overlay2"
    folder = Path(tempfile.mkdtemp(prefix="pg-gpuhost-", dir="/tmp"))  # short: a unix socket path is <108 bytes
    (folder / "bin").mkdir()
    hook = folder / "bin" / "nvidia-container-runtime-hook"
    hook.write_text(HOOK)
    hook.chmod(0o755)
    engine = GpuEngine(folder)
    dockerd = [
        "dockerd", f"--data-root={folder / 'root'}", f"--exec-root={folder / 'exec'}", f"--pidfile={folder / 'pid'}",
        f"--host={engine.host}", "--bridge=none", "--iptables=false", "--ip-masq=false", "--ip-forward=false",
        f"--storage-driver={driver}", f"--add-runtime=nvidia={runc}",
    ]  # fmt: skip
    # Its own network namespace: with --bridge=none, dockerd deletes any `docker0` it can see, and the
    # host's belongs to the main engine. The socket is a file, so it is reachable from here all the same.
    cmd = ["unshare", "--net", "--", *dockerd]
    env = {**os.environ, "PATH": f"{folder / 'bin'}:{os.environ.get('PATH', '')}"}
    with open(folder / "dockerd.log", "wb") as log:
        daemon = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(
            lambda: daemon.poll() is not None or engine.docker("info", timeout=10).returncode == 0,
            "the GPU engine to start",
            60,
        )
        assert daemon.poll() is None, (folder / "dockerd.log").read_text()[-3000:]
        save = subprocess.Popen(["docker", "save", BASE_IMAGE], stdout=subprocess.PIPE)
        subprocess.run(["docker", "-H", engine.host, "load", "-q"], stdin=save.stdout, check=True, capture_output=True)
        assert save.wait() == 0
        yield engine
    finally:
        ids = engine.docker("ps", "-aq").stdout.split()
        if ids:
            engine.docker("rm", "-f", *ids, timeout=120)
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        shutil.rmtree(folder, ignore_errors=True)


def _spec(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.toml"
    # A command that ends on SIGTERM (a bare `sleep` as PID 1 ignores it, and every stop would take 30 s).
    args = "bash -c 'trap \\\"exit 143\\\" TERM; sleep 600 & wait'"
    gpu = '[gpu]\ntypes = ["NVIDIA H100 80GB HBM3"]\ncount = 2\n'
    path.write_text(f'name = "{name}"\nimage = "{BASE_IMAGE}"\nargs = "{args}"\n\n{gpu}')
    return path


def _run(engine: GpuEngine, spec: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return podguard("image", "run", "--spec", str(spec), *args, env=engine.env, timeout=180)


def _visible_devices(engine: GpuEngine, name: str) -> str | None:
    """NVIDIA_VISIBLE_DEVICES as the container's process got it (set by the engine, not in its config)."""
    out = engine.docker("exec", name, "cat", "/proc/1/environ", check=True).stdout.split("\0")
    return next((e.split("=", 1)[1] for e in out if e.startswith("NVIDIA_VISIBLE_DEVICES=")), None)


def test_gpus_become_device_requests(gpu_engine: GpuEngine, tmp_path: Path) -> None:
    proc = _run(gpu_engine, _spec(tmp_path, "pg-gpu-list"), "--gpus", "0,1", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    attrs = gpu_engine.inspect("pg-gpu-list")
    [request] = attrs["HostConfig"]["DeviceRequests"]
    assert request["DeviceIDs"] == ["0", "1"] and request["Capabilities"] == [["gpu"]], request
    assert _visible_devices(gpu_engine, "pg-gpu-list") == "0,1"
    assert "RUNPOD_GPU_COUNT=2" in attrs["Config"]["Env"]
    assert result["gpus"] == "GPU 0,1"

    # No --gpus: the spec's [gpu] means all of this host's GPUs; podguard's own container on them is stopped.
    all_gpus = _run(gpu_engine, _spec(tmp_path, "pg-gpu-all"))
    assert all_gpus.returncode == 0, all_gpus.stderr
    assert "stopping pg-gpu-list" in all_gpus.stderr
    assert gpu_engine.inspect("pg-gpu-all")["HostConfig"]["DeviceRequests"][0]["Count"] == -1
    assert _visible_devices(gpu_engine, "pg-gpu-all") == "all"


def test_podguard_containers_on_the_gpus_are_stopped_others_only_with_force(
    gpu_engine: GpuEngine, tmp_path: Path
) -> None:
    first = _run(gpu_engine, _spec(tmp_path, "pg-first"), "--gpus", "device=0")
    assert first.returncode == 0, first.stderr
    gpu_engine.docker(
        "run", "-d", "--init", "--name", "someone-else", "--gpus", "device=1", BASE_IMAGE, "sleep", "600", check=True
    )
    gpu_engine.docker(
        "run", "-d", "--init", "--name", "legacy-runtime", "--runtime", "nvidia", "-e", "NVIDIA_VISIBLE_DEVICES=3",
        BASE_IMAGE, "sleep", "600", check=True,
    )  # fmt: skip

    # GPU 0 (podguard's container) and GPU 1 (someone else's): refused, nothing stopped, nothing started.
    refused = _run(gpu_engine, _spec(tmp_path, "pg-second"), "--gpus", "2")
    assert refused.returncode == 75, refused.stdout + refused.stderr
    assert "someone-else" in refused.stderr and "--force" in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert gpu_engine.inspect("pg-first")["State"]["Running"]
    assert gpu_engine.docker("inspect", "pg-second").returncode != 0

    # GPU 0 only: podguard's own container is stopped and named; the others are left alone.
    took = _run(gpu_engine, _spec(tmp_path, "pg-second"), "--gpus", "device=0")
    assert took.returncode == 0, took.stderr
    assert "stopping pg-first" in took.stderr
    assert not gpu_engine.inspect("pg-first")["State"]["Running"]
    assert gpu_engine.inspect("someone-else")["State"]["Running"]

    # The NVIDIA runtime's own form (NVIDIA_VISIBLE_DEVICES) counts too; --force stops it.
    legacy = _run(gpu_engine, _spec(tmp_path, "pg-third"), "--gpus", "device=3")
    assert legacy.returncode == 75 and "legacy-runtime" in legacy.stderr, legacy.stderr
    forced = _run(gpu_engine, _spec(tmp_path, "pg-third"), "--gpus", "device=3", "--force")
    assert forced.returncode == 0, forced.stderr
    assert not gpu_engine.inspect("legacy-runtime")["State"]["Running"]
    assert gpu_engine.inspect("someone-else")["State"]["Running"]
    assert gpu_engine.inspect("pg-third")["State"]["Running"]
