"""`podguard image run` and `podguard image smoke` as users run them, against the real engine (no NVIDIA
runtime here: the GPU side is test_image_gpuhost.py). `podguard image build` runs in the session fixture."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest
from imagetools import docker, podguard, wait_for, wait_for_log

pytestmark = [pytest.mark.docker, pytest.mark.slow]

SPEC = """name = "{name}"
image = "{image}"
args = "bash -c 'echo POD-UP; exec sleep 600'"
ports = ["22/tcp", "8888/http"]

[gpu]
types = ["NVIDIA H100 80GB HBM3"]
count = 2

[volume]
size_gb = 10
path = "/workspace"

[env]
WANDB_PROJECT = "demo run"
HF_TOKEN = "{{{{ RUNPOD_SECRET_hf_token }}}}"
OTHER_SECRET = "{{{{ RUNPOD_SECRET_not_set_here }}}}"
"""


@pytest.fixture
def pod(image: str, tmp_path: Path) -> Iterator[tuple[Path, str, dict[str, str]]]:
    """A spec file, the pod's name, and the environment `podguard image run` gets (HOME with an SSH key)."""
    name = f"pg-test-{uuid.uuid4().hex[:8]}"
    spec = tmp_path / "pod.toml"
    spec.write_text(SPEC.format(name=name, image=image))
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    key = paramiko.ECDSAKey.generate(bits=256)
    key.write_private_key_file(str(home / ".ssh" / "id_ecdsa"))
    (home / ".ssh" / "id_ecdsa.pub").write_text(f"{key.get_name()} {key.get_base64()} me@laptop\n")
    env = {"HOME": str(home), "RUNPOD_SECRET_hf_token": "hf_localvalue0123456789abcdef"}
    yield spec, name, env
    docker("rm", "-f", name, timeout=60)
    docker("volume", "rm", "-f", f"{name}-volume", timeout=60)


def _env(attrs: dict) -> dict[str, str]:
    return dict(item.split("=", 1) for item in attrs["Config"]["Env"])


def test_image_run_runs_the_spec_like_runpod(pod) -> None:
    spec, name, env = pod
    proc = podguard("image", "run", "--spec", str(spec), "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert "no NVIDIA runtime on this Docker engine: running on CPU" in proc.stderr
    assert "RUNPOD_SECRET_not_set_here" in proc.stderr  # the reference it could not resolve is named
    attrs = json.loads(docker("inspect", name, check=True).stdout)[0]
    pod_env = _env(attrs)

    assert re.fullmatch(r"[0-9a-f]{14}", pod_env["RUNPOD_POD_ID"]) and attrs["Config"]["Hostname"] == result["pod_id"]
    assert pod_env["RUNPOD_POD_ID"] == result["pod_id"]
    assert pod_env["WANDB_PROJECT"] == "demo run"
    assert pod_env["HF_TOKEN"] == env["RUNPOD_SECRET_hf_token"]
    assert "OTHER_SECRET" not in pod_env
    assert pod_env["PUBLIC_KEY"] == (Path(env["HOME"]) / ".ssh" / "id_ecdsa.pub").read_text().strip()
    assert attrs["HostConfig"]["RestartPolicy"]["Name"] == "unless-stopped"
    assert not attrs["HostConfig"]["DeviceRequests"]
    assert attrs["Config"]["Labels"]["io.podguard.managed"] == "true"
    [mount] = attrs["Mounts"]
    assert (mount["Type"], mount["Name"], mount["Destination"]) == ("volume", f"{name}-volume", "/workspace")
    assert set(result["ports"]) == {"22/tcp", "8888/tcp"}
    assert all(where.startswith("127.0.0.1:") for where in result["ports"].values()), result["ports"]

    # Your key logs in over the published port.
    port = int(result["ports"]["22/tcp"].rsplit(":", 1)[1])
    key = paramiko.ECDSAKey.from_private_key_file(str(Path(env["HOME"]) / ".ssh" / "id_ecdsa"))
    wait_for(lambda: _ssh_ok(port, key), "an SSH login with ~/.ssh/id_ecdsa.pub", 30, name)
    # RunPod restarts the container when its command exits: end the command, and it comes back.
    wait_for_log(name, "POD-UP")
    # Detached: a waited-for exec races with PID 1's death (the engine SIGKILLs the exec with the container: 137).
    # Not `docker kill --signal TERM`: it disables the restart policy this step checks until the next start
    # (docs.docker.com/reference/cli/docker/container/kill/; moby's killWithSignal calls ExitOnNext).
    docker("exec", "--detach", name, "kill", "-TERM", "1", check=True)
    wait_for_log(name, "POD-UP", deadline_s=60, count=2)
    assert int(docker("inspect", "-f", "{{.RestartCount}}", name).stdout) == 1

    # Running the spec again replaces its own container: a new container, a new pod id, the same volume.
    again = podguard("image", "run", "--spec", str(spec), "--json", env=env)
    assert again.returncode == 0, again.stderr
    second = json.loads(again.stdout)
    assert second["replaced"] == attrs["Id"][:12] and second["container_id"] != attrs["Id"]
    assert second["pod_id"] != result["pod_id"]


def _ssh_ok(port: int, key: paramiko.PKey) -> bool:
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    try:
        client.connect("127.0.0.1", port, username="root", pkey=key, look_for_keys=False, allow_agent=False, timeout=5)
        _, stdout, _ = client.exec_command("echo $RUNPOD_POD_ID", timeout=10)
        return bool(stdout.read().strip())
    except (paramiko.SSHException, OSError):
        return False
    finally:
        client.close()


def test_image_run_refuses_what_it_cannot_do_and_changes_nothing(pod, image: str) -> None:
    spec, name, env = pod
    gpus = podguard("image", "run", "--spec", str(spec), "--gpus", "2", env=env)
    assert gpus.returncode == 69, gpus.stderr
    assert "no NVIDIA runtime" in gpus.stderr and len(gpus.stderr.strip().splitlines()) == 1

    docker("run", "-d", "--name", name, image, "bash", "-c", "sleep 600", check=True)  # not podguard's
    taken = podguard("image", "run", "--spec", str(spec), env=env)
    assert taken.returncode == 64, taken.stderr
    assert name in taken.stderr and "--force" in taken.stderr
    assert json.loads(docker("inspect", name, check=True).stdout)[0]["State"]["Running"]

    bad = spec.with_name("bad.toml")
    bad.write_text("gpus_typo = 3\n" + spec.read_text())
    refused = podguard("image", "run", "--spec", str(bad), env=env)
    assert refused.returncode == 64 and "gpus_typo" in refused.stderr, refused.stderr
    bad_gpus = podguard("image", "run", "--spec", str(spec), "--gpus", "0", env=env)
    assert bad_gpus.returncode == 64 and "device=0" in bad_gpus.stderr, bad_gpus.stderr


def test_image_smoke_reports_each_check_with_timings(image: str) -> None:
    proc = podguard("image", "smoke", image, "--json", timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert list(checks) == ["version", "doctor --json", "demo train", "docker stop"]
    assert all(c["ok"] for c in checks.values()), checks
    demo = checks["demo train"]["timings"]
    assert 0 < demo["run_to_summary_s"] < demo["run_to_first_job_line_s"] < demo["run_to_exit_s"], demo
    assert demo["preflight_ms"] >= 0
    print(f"\n[image] smoke timings: {json.dumps({n: (c['seconds'], c['timings']) for n, c in checks.items()})}")
    leftovers = docker("ps", "-aq", "--filter", f"ancestor={image}", "--filter", "label=io.podguard.managed").stdout
    assert not leftovers.strip(), "smoke left containers behind"


def test_image_smoke_fails_an_image_that_swallows_sigterm(image: str, tmp_path: Path) -> None:
    # The classic broken entrypoint: a shell as PID 1 without an init, which neither forwards SIGTERM nor
    # dies of it, so `docker stop` waits for its SIGKILL. Smoke must say so and exit non-zero.
    (tmp_path / "Dockerfile").write_text(
        f'FROM {image}\nENTRYPOINT ["bash", "-c", "/usr/local/bin/podguard-entrypoint \\"$@\\"; exit $?", "sh"]\n'
    )
    broken = image.replace(":", "-broken:", 1)
    docker("build", "-q", "-t", broken, str(tmp_path), check=True, timeout=300)
    try:
        proc = podguard("image", "smoke", broken, "--check", "docker stop", timeout=300)
    finally:
        docker("rmi", "-f", broken)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert re.search(r"FAIL docker stop .*exit 137", proc.stdout), proc.stdout
    assert "FAIL (0/1 checks" in proc.stdout


def test_image_commands_reject_bad_input_before_any_work(image: str) -> None:
    tag = podguard("image", "build", "--tag", "Not A Tag")
    assert tag.returncode == 64 and "Not A Tag" in tag.stderr, tag.stderr
    check = podguard("image", "smoke", image, "--check", "nope")
    assert check.returncode == 64 and "docker stop" in check.stderr, check.stderr
    missing = podguard("image", "smoke", "podguard-test-missing:none")
    assert missing.returncode == 64 and "podguard image build" in missing.stderr, missing.stderr
