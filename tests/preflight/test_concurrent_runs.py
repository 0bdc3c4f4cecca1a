"""Issue 7 item 2: concurrent podguard runs on one host must not kill each other.

Run A is a real process holding a real GPU lease (podguard's own lease code) whose job children are
stand-in GPU processes on the fake NVML; run B is `run_preflight` for `run` on another GPU, in-process.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from fakenvml import NvmlNode, pid_alive
from fakenvml.runs import LeasedRun
from podguard import console
from podguard.preflight.options import PreflightOptions, ProbeMode
from podguard.preflight.pipeline import run_preflight

TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture
def runs() -> Any:
    started: list[LeasedRun] = []
    yield started
    for run in started:
        run.stop()


def run_b(node: NvmlNode, gpu_list: str, **changes: Any) -> Any:
    fields: dict[str, Any] = {"busy_timeout_s": 1.0, "grace_s": 1.0, **changes}
    opts = PreflightOptions(
        command="run", gpu_list=gpu_list, lease=True, probe=ProbeMode.OFF, dev_dir=node.dev_dir, **fields
    )
    result = run_preflight(opts)
    if result.lease is not None:
        result.lease.release()
    return result


def test_a_process_that_only_initialised_nvml_is_not_a_holder_of_another_runs_gpu(cli_node: NvmlNode, runs) -> None:
    # Run A's worker holds GPU 0; like every NVML user it has every /dev/nvidiaN open.
    a = LeasedRun(cli_node, "0", [{"gpu": 0, "kw": {"open_all": True}}])
    runs.append(a)
    metrics = cli_node.spawn_holder(0, 0, monitor=True, open_all=True)  # a metrics thread outside any lease
    result = run_b(cli_node, "1")
    assert result.exit_code == 0, result.summary
    assert pid_alive(a.pid) and all(pid_alive(k) for k in a.kids), "run B's cleanup killed run A's job"
    assert pid_alive(metrics.pid), "a process that only initialised NVML was treated as a GPU holder"
    report = json.loads(Path(result.report_path).read_text())
    assert report["cleanup"]["killed"] == []
    assert {s["code"] for s in report["cleanup"]["skipped"]} <= {"fd_only", "leased"}


def test_cleanup_inside_run_never_touches_a_process_under_another_live_lease(cli_node: NvmlNode, runs) -> None:
    # Run A leased GPU 0, but its job also holds GPU 1 (NVML lists it there): run B on GPU 1 must not
    # touch it, and says why it cannot start.
    a = LeasedRun(cli_node, "0", [{"gpu": 1}])
    runs.append(a)
    result = run_b(cli_node, "1", busy_timeout_s=0.5)
    assert all(pid_alive(k) for k in a.kids) and pid_alive(a.pid), "run B killed a process under run A's lease"
    assert result.exit_code == 75, result.summary
    report = json.loads(Path(result.report_path).read_text())
    skipped = {s["pid"]: s for s in report["cleanup"]["skipped"]}
    assert skipped[a.kids[0]]["code"] == "leased" and f"pid {a.pid}" in skipped[a.kids[0]]["reason"]
    assert "hf_abcdefghijklmnopqrstuvwx" not in Path(result.report_path).read_text()  # redacted lease command
    assert any("another live podguard run" in r for r in report["recommendations"])


def test_a_run_waiting_for_leased_gpus_says_how_the_wait_goes(cli_node: NvmlNode, runs) -> None:
    # --wait-for-gpus: run B waits for run A's GPU 0. It used to wait in silence (the preflight never handed
    # the lease wait a way to speak); now the console names the holder while it waits, then B gets the GPU.
    a = LeasedRun(cli_node, "0", [])
    runs.append(a)
    release = threading.Timer(0.6, a.stop)
    release.start()
    try:
        with console.captured() as lines:
            result = run_b(cli_node, "0", wait_for_gpus=True, busy_timeout_s=30.0)
    finally:
        release.join()
    assert result.exit_code == 0, result.summary
    waits = [line for line in lines if "waiting for GPUs" in line]
    assert waits and f"pid {a.pid}" in waits[0] and waits[0].startswith("podguard: "), lines
