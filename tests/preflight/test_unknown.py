"""Issue 7 item 4: "cannot tell" is unknown, never idle: it is reported, never passes the gate and never
ends a cleanup wait. Real NVML binding on the fake library, real `podguard` processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from fakenvml import NvmlNode
from podguard.preflight.cleanup.executor import wait_for_idle

PODGUARD = [sys.executable, "-m", "podguard"]


@pytest.mark.parametrize(
    ("field", "error"),
    [("compute_procs", "NO_PERMISSION"), ("memory", "NOT_SUPPORTED"), ("compute_procs", "NOT_SUPPORTED")],
)
def test_health_never_passes_a_gpu_nvml_cannot_read(cli_node: NvmlNode, field: str, error: str) -> None:
    cli_node.scenario.gpus[1].fail[field] = error
    cli_node.write()
    proc = subprocess.run([*PODGUARD, "health", "--json"], env=cli_node.env, capture_output=True, text=True)
    assert proc.returncode == 75, proc.stderr
    verdicts = {v["index"]: v for v in json.loads(proc.stdout)["report"]["gate"]["verdicts"]}
    assert verdicts[1]["verdict"] == "unknown" and error in " ".join(verdicts[1]["reasons"])
    assert {v["verdict"] for i, v in verdicts.items() if i != 1} == {"healthy"}
    assert "cannot tell whether GPU(s) 1 are free" in proc.stderr
    assert "after waiting" not in proc.stderr  # health does not wait: the message must not say it did


def test_cleanup_on_a_gpu_whose_process_list_is_unreadable_is_not_a_success(cli_node: NvmlNode) -> None:
    cli_node.scenario.gpus[0].fail["compute_procs"] = "NO_PERMISSION"
    cli_node.write()
    proc = subprocess.run(
        [*PODGUARD, "cleanup", "--gpu-list", "0", "--busy-timeout", "0.3"],
        env=cli_node.env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 75, proc.stderr
    assert "NO_PERMISSION" in proc.stderr


def test_a_gpu_lost_during_the_wait_is_unknown_not_idle_and_ends_the_wait(nvml_node: NvmlNode) -> None:
    """Lost is final (the gate fails it, 76): the wait stops at once instead of burning the busy timeout,
    and the GPU is reported as unknown, never as idle."""
    holder = nvml_node.spawn_holder(0, 8192)
    backend = nvml_node.backend()
    assert backend.processes(0)
    nvml_node.scenario.gpus[0].lost = True  # falls off the bus while its holder still runs
    nvml_node.write()
    t0 = time.monotonic()
    states = wait_for_idle(backend, [0], deadline=t0 + 30, dev_dir=nvml_node.dev_dir)
    assert str(states[0].state) == "unknown" and "GPU_IS_LOST" in states[0].detail
    assert time.monotonic() - t0 < 10, "a lost GPU kept the wait going until the deadline"
    assert holder.poll() is None


def test_a_lost_gpu_fails_the_preflight_at_once_not_after_the_busy_timeout(cli_node: NvmlNode) -> None:
    cli_node.scenario.gpus[0].lost = True
    cli_node.write()
    t0 = time.monotonic()
    proc = subprocess.run(
        [*PODGUARD, "run", "--busy-timeout", "60", "--", "true"], env=cli_node.env, capture_output=True, text=True
    )
    assert proc.returncode == 76, proc.stderr
    assert time.monotonic() - t0 < 20, "waited for a lost GPU to free its memory"
    assert "GPU0 UNHEALTHY" in proc.stderr and "waiting for GPU0" not in proc.stderr
