"""Self-heal and `--on-exit stop-pod` from inside a pod: real `podguard train` processes on the fake NVML node,
with RUNPOD_POD_ID and the stand-in API, exactly as the container's entry process would run them."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
from pods_support import PODGUARD, standin  # noqa: F401 (fixture)

from fakenvml import scenario as sc
from loadfactor import scaled

JOB = ["train", "--mode", "single", "--", sys.executable, "-c", "pass"]


@pytest.fixture
def pod(standin, cli_node):  # noqa: F811
    """This container's pod in the stand-in (RUNNING), and a node whose GPU 3 has retired pages pending (76)."""
    record = standin.world.create(
        {
            "name": "trainer",
            "image": "img:1",
            "args": "train",
            "env": {"WANDB_PROJECT": "demo"},
            "ports": ["22/tcp"],
            "gpu": {"id": "NVIDIA A40", "count": 8},
        }
    )
    deadline = time.monotonic() + 10
    while record.status != "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.02)
    cli_node.write(sc.retired_pages(gpu=3))
    return record


def train(node, pod_id: str, args=JOB, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PODGUARD, *args], env={**node.env, "RUNPOD_POD_ID": pod_id, **env}, capture_output=True, text=True, timeout=90
    )


def actions(standin, pod_id: str) -> list[str]:  # noqa: F811
    return [json.loads(c.body)["action"] for c in standin.calls("POST", rf"^/v2/pods/{pod_id}/action$")]


def park_and_stop(node, pod_id: str, **env: str) -> tuple[int, str]:
    """Run until the PARKED line, then SIGTERM it (a parked container waits for a signal)."""
    proc = subprocess.Popen(
        [*PODGUARD, *JOB], env={**node.env, "RUNPOD_POD_ID": pod_id, **env}, stderr=subprocess.PIPE, text=True
    )
    seen = []
    assert proc.stderr is not None
    for line in proc.stderr:
        seen.append(line)
        if "PARKED" in line:
            break
    _wait_until_it_holds_sigterm(proc.pid)  # its signal wait (the stop request, when asked for, comes after the line)
    proc.send_signal(signal.SIGTERM)
    rest = proc.communicate(timeout=30)[1]
    return proc.returncode, "".join(seen) + rest


def _wait_until_it_holds_sigterm(pid: int) -> None:
    """Until the process catches SIGTERM (its park holds the signals with a handler installed): a fixed sleep
    is a window a busy machine misses, and a SIGTERM before it would kill podguard with the default action."""
    bit = 1 << (signal.SIGTERM - 1)
    deadline = time.monotonic() + scaled(10)
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/status") as status:
            caught = next(int(line.split()[1], 16) for line in status if line.startswith("SigCgt:"))
        if caught & bit:
            return
        time.sleep(0.01)
    raise AssertionError(f"podguard (pid {pid}) never came to catch SIGTERM while parked")


def test_restart_after_n_failures_then_park_and_stop_never_looping(standin, pod, cli_node):  # noqa: F811
    env = {"PODGUARD_SELF_HEAL": "restart", "PODGUARD_SELF_HEAL_AFTER": "2", "PODGUARD_PARK": "stop"}
    first = train(cli_node, pod.id, **env)
    assert first.returncode == 76, first.stderr
    assert "preflight failure 1 of 2" in first.stderr and actions(standin, pod.id) == []
    second = train(cli_node, pod.id, **env)
    assert second.returncode == 76 and "asking RunPod to restart pod" in second.stderr
    assert actions(standin, pod.id) == ["restart"]
    assert train(cli_node, pod.id, **env).returncode == 76  # failure 1 after the restart
    code, err = park_and_stop(cli_node, pod.id, **env)
    assert code == 128 + signal.SIGTERM and "PARKED" in err and "tried: restart" in err
    assert actions(standin, pod.id) == ["restart", "stop"]
    standin.world.act(pod.id, "start")  # someone starts the parked pod again: it parks at once, no new restart
    code, err = park_and_stop(cli_node, pod.id, **env)
    assert "PARKED" in err and "asking RunPod to restart" not in err
    assert actions(standin, pod.id) == ["restart", "stop", "stop"]


def test_replace_creates_an_identical_pod_then_terminates_itself_and_the_copy_never_replaces(standin, pod, cli_node):  # noqa: F811
    env = {"PODGUARD_SELF_HEAL": "replace", "PODGUARD_SELF_HEAL_AFTER": "1"}
    assert train(cli_node, pod.id, **env).returncode == 76
    assert actions(standin, pod.id) == ["restart"]
    replaced = train(cli_node, pod.id, **env)
    assert replaced.returncode == 76, replaced.stderr
    assert "replacing pod" in replaced.stderr and pod.status == "TERMINATED"
    (new,) = [p for p in standin.world.pods.values() if p.id != pod.id]
    assert (new.name, new.image, new.gpu_type, new.gpu_count) == (pod.name, pod.image, pod.gpu_type, pod.gpu_count)
    mark = new.env.pop("PODGUARD_MARK")  # the pod had no mark (made by hand): its replacement is podguard's
    assert mark.startswith("podguard/1 name=") and "keep=self-heal" in mark
    assert new.env == {**pod.env, "PODGUARD_HEAL_REPLACED_FROM": pod.id}
    copy_env = {**env, "PODGUARD_HEAL_REPLACED_FROM": pod.id}
    assert train(cli_node, new.id, **copy_env).returncode == 76  # the copy: restart first ...
    _, err = park_and_stop(cli_node, new.id, **copy_env)  # ... then park, never a second replacement
    assert "PARKED" in err and len(standin.world.pods) == 2
    assert actions(standin, new.id) == ["restart"]


def test_a_passing_preflight_resets_the_count(standin, pod, cli_node, tmp_path):  # noqa: F811
    env = {"PODGUARD_SELF_HEAL": "restart", "PODGUARD_SELF_HEAL_AFTER": "2"}
    assert train(cli_node, pod.id, **env).returncode == 76
    cli_node.write(sc.healthy_h100())
    assert train(cli_node, pod.id, **env).returncode == 0
    cli_node.write(sc.retired_pages(gpu=3))
    assert train(cli_node, pod.id, **env).returncode == 76
    assert actions(standin, pod.id) == []
    (state,) = (tmp_path / "state" / "selfheal").glob("*.json")
    assert json.loads(state.read_text())["failures"] == 1


def test_bad_self_heal_settings_are_64_before_anything_runs(standin, pod, cli_node):  # noqa: F811
    proc = train(cli_node, pod.id, PODGUARD_SELF_HEAL="reboot")
    assert proc.returncode == 64 and "PODGUARD_SELF_HEAL='reboot'" in proc.stderr
    assert "off, restart, replace" in proc.stderr and standin.requests == []


def test_on_exit_stop_pod_stops_this_pod_after_a_successful_job(standin, pod, cli_node):  # noqa: F811
    cli_node.write(sc.healthy_h100())
    args = ["train", "--on-exit", "stop-pod", "--mode", "single", "--", sys.executable, "-c", "pass"]
    proc = train(cli_node, pod.id, args)
    assert proc.returncode == 0, proc.stderr
    assert actions(standin, pod.id) == ["stop"] and pod.status == "EXITED"
    failing = [*args[:-2], "-c", "raise SystemExit(3)"]
    standin.world.act(pod.id, "start")
    assert train(cli_node, pod.id, failing).returncode == 3
    assert actions(standin, pod.id) == ["stop"]  # only a successful job stops the pod


def test_on_exit_stop_pod_outside_a_pod_is_refused_before_the_job(standin, cli_node):  # noqa: F811
    cli_node.write(sc.healthy_h100())
    proc = subprocess.run(
        [*PODGUARD, "train", "--on-exit", "stop-pod", "--", sys.executable, "-c", "print('ran')"],
        env={k: v for k, v in cli_node.env.items() if k != "RUNPOD_POD_ID"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 64 and "RUNPOD_POD_ID" in proc.stderr and "ran" not in proc.stdout
    assert standin.requests == []
