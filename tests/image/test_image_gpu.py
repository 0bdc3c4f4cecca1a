"""The GPU path inside the container, with the tests' fake NVML where the NVIDIA toolkit would mount the
driver's libnvidia-ml.so.1 and the fake device files at /dev/nvidia*: `podguard cleanup` run through
`docker exec` stops a holder inside the container, and the image's own HEALTHCHECK command passes while the
container's training job holds its GPU; when that GPU is lost the job's run-time watch ends the container with 76
and the HEALTHCHECK command fails with 76 too."""

from __future__ import annotations

import json

import pytest
from imagetools import docker, fake_gpu_args, holder_command, logs, proc_table, wait_exited, wait_for

from fakenvml import lost_gpu

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def _ready(cid: str, path: str) -> dict[str, str] | None:
    proc = docker("exec", cid, "cat", path)
    if proc.returncode != 0:
        return None
    return dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)


def _healthcheck(image: str) -> list[str]:
    """The image's own HEALTHCHECK command (`CMD` form)."""
    config = json.loads(docker("image", "inspect", image, check=True).stdout)[0]["Config"]
    test = config["Healthcheck"]["Test"]
    assert test[0] == "CMD", test
    return test[1:]


def test_cleanup_via_docker_exec_stops_a_holder_in_the_container(container, nvml_node) -> None:
    opts = [*fake_gpu_args(nvml_node), "-e", "PODGUARD_PROBE=off"]
    cid = container("bash", "-c", "echo POD UP; exec sleep 600", opts=opts)
    gpus = docker("exec", cid, "podguard", "gpus", "--json", check=True)
    assert len(json.loads(gpus.stdout)["gpus"]) == 8, gpus.stdout  # NVML loaded from the toolkit's path

    docker("exec", "-d", cid, *holder_command(0, 4096, "/tmp/holder.ready"), check=True)
    ready = wait_for(lambda: _ready(cid, "/tmp/holder.ready"), "the holder to start", 30, cid)
    pid = int(ready["pid"])
    assert any(p == pid for p, *_ in proc_table(cid))

    cleanup = docker("exec", cid, "podguard", "cleanup", "--gpu-list", "0", "--json", timeout=120)
    assert cleanup.returncode == 0, cleanup.stdout + cleanup.stderr
    killed = json.loads(cleanup.stdout)["report"]["cleanup"]["killed"]
    assert [k["pid"] for k in killed] == [pid], killed
    assert not any(p == pid for p, *_ in proc_table(cid)), "the holder is still running"


def test_healthcheck_passes_while_the_job_trains_and_a_lost_gpu_ends_the_job_and_fails_the_check(
    any_container, nvml_node, any_image
) -> None:
    job = holder_command(0, 8192, "/tmp/job.ready")
    opts = [*fake_gpu_args(nvml_node), "-e", "PODGUARD_PROBE=off", "-e", "GPU_LIST=0"]
    cid = any_container("train", "--mode", "single", "--", *job, opts=opts)
    wait_for(lambda: _ready(cid, "/tmp/job.ready"), "the training job to hold its GPU", 60, cid)
    assert any(nvml_node.procs_dir.iterdir()), "the job did not register on the fake GPU"

    check = _healthcheck(any_image)
    healthy = docker("exec", cid, *check, timeout=60)
    assert healthy.returncode == 0, f"{check} exited {healthy.returncode}:\n{healthy.stdout}{healthy.stderr}"

    # The run-time GPU watch ends the job itself (76, naming the GPU) within seconds: the container exits.
    nvml_node.write(lost_gpu(gpu=0))
    assert wait_exited(cid, 60) == 76, logs(cid)
    out = logs(cid)
    assert "GPU 0" in out and "lost" in out, out

    # The HEALTHCHECK command on its own fails on the lost GPU too (a container whose job is not podguard's).
    idle = any_container("bash", "-c", "exec sleep 600", opts=opts)
    lost = docker("exec", idle, *check, timeout=60)
    assert lost.returncode == 76, f"{check} exited {lost.returncode} on a lost GPU:\n{lost.stdout}{lost.stderr}"
