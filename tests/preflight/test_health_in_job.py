"""Issue 7 item 7: `podguard health` inside a container whose own job is training (the image's HEALTHCHECK).

GPUs leased by a live podguard run are in use as expected: health checks their hardware and that the run
(the lease holder) is alive, and passes when both are fine. Real `podguard health` processes, a real
lease holder, stand-in GPU workers on the fake NVML.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from fakenvml import NvmlNode
from fakenvml.runs import LeasedRun

PODGUARD = [sys.executable, "-m", "podguard"]


@pytest.fixture
def runs() -> Any:
    started: list[LeasedRun] = []
    yield started
    for run in started:
        run.stop()


def health(node: NvmlNode, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[int, dict[str, Any]]]:
    proc = subprocess.run([*PODGUARD, "health", "--json", *args], env=node.env, capture_output=True, text=True)
    verdicts = {v["index"]: v for v in json.loads(proc.stdout)["report"]["gate"]["verdicts"]}
    return proc, verdicts


def test_gpus_in_use_by_a_live_podguard_run_pass_health(cli_node: NvmlNode, runs: list[LeasedRun]) -> None:
    job = LeasedRun(cli_node, "0,1", [{"gpu": 0}, {"gpu": 1}])  # the container's training job
    runs.append(job)
    proc, verdicts = health(cli_node)
    assert proc.returncode == 0, proc.stderr
    assert verdicts[0]["verdict"] == verdicts[1]["verdict"] == "in_use"
    assert f"pid {job.pid}" in verdicts[0]["reasons"][0]
    assert {verdicts[i]["verdict"] for i in range(2, 8)} == {"healthy"}
    assert "PASS on 8 GPU(s)" in proc.stderr and "after waiting" not in proc.stderr


def test_a_leased_gpu_with_a_hardware_fault_still_fails_health(cli_node: NvmlNode, runs: list[LeasedRun]) -> None:
    runs.append(LeasedRun(cli_node, "0", [{"gpu": 0}]))
    cli_node.scenario.gpus[0].ecc_uncorrected_volatile = 3
    cli_node.write()
    proc, verdicts = health(cli_node)
    assert proc.returncode == 76, proc.stderr
    assert verdicts[0]["verdict"] == "unhealthy"


def test_when_the_run_is_gone_its_orphaned_workers_make_the_gpu_busy(cli_node: NvmlNode, runs: list[LeasedRun]) -> None:
    job = LeasedRun(cli_node, "0", [{"gpu": 0}])
    runs.append(job)
    job.kill()  # the supervisor dies; its worker keeps the GPU
    proc, verdicts = health(cli_node)
    assert proc.returncode == 75, proc.stderr
    assert verdicts[0]["verdict"] == "busy"
    assert "GPU(s) 0 busy" in proc.stderr and "after waiting" not in proc.stderr
