"""End to end, issue 18: no false verdict on the hardware RunPod pods really have. `podguard health` and `doctor`
run as real subprocesses against the fake libnvidia-ml.so.1; a PODGUARD_PROBE_CMD program stands in for the CUDA
probe and reports its GPU's metrics as one JSON line (and, where a test needs it, changes the node meanwhile)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fakenvml import scenario as sc

PODGUARD = [sys.executable, "-m", "podguard"]
H100_SXM = {"matmul_tflops": 800.0, "mem_gbps": 3000.0, "h2d_gbps": 50.0}


@pytest.fixture
def node(cli_node):
    return cli_node


def run_pg(node, args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PODGUARD, *args],
        env={**node.env, **env},
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def probe_program(
    tmp_path: Path, per_gpu: dict[int, dict[str, float]], default: dict[str, float], extra: str = ""
) -> Path:
    """A probe printing per_gpu[index] (else `default`) for the GPU it runs for; `extra` is shell run first."""
    lines = [f"  {i}) echo '{json.dumps({**default, **m})}' ;;" for i, m in per_gpu.items()]
    path = tmp_path / "measure.sh"
    path.write_text(
        "#!/bin/sh\n"
        + extra
        + 'case "$PODGUARD_PROBE_GPU_INDEX" in\n'
        + "\n".join(lines)
        + f"\n  *) echo '{json.dumps(default)}' ;;\nesac\n"
    )
    path.chmod(0o755)
    return path


def health_json(node, program: Path | None = None, **env: str) -> tuple[int, dict, str]:
    if program is not None:
        env = {"PODGUARD_PROBE": "cuda", "PODGUARD_PROBE_CMD": str(program), **env}
    proc = run_pg(node, ["health", "--json"], **env)
    return proc.returncode, json.loads(proc.stdout)["report"], proc.stderr


# --- 1. NVLink-capable PCIe cards without a bridge ------------------------------------------------------------


@pytest.mark.parametrize(("name", "links"), [("NVIDIA A40", 4), ("NVIDIA RTX A6000", 4), ("NVIDIA H100 PCIe", 18)])
def test_bridgeless_nvlink_capable_pcie_cards_pass_the_default_gate(node, name, links):
    node.write(sc.nvlink_bridgeless(name=name, links=links, count=4))
    code, report, stderr = health_json(node)
    assert code == 0, stderr
    assert [(g["verdict"], g["degraded"]) for g in report["gpus"]] == [("healthy", [])] * 4


def test_a_bridged_pair_with_one_link_down_is_still_caught(node):
    scenario = sc.nvlink_bridgeless(count=4)
    scenario.gpus[0].nvlink_down, scenario.gpus[1].nvlink_down = set(), {2}  # pair 0-1 bridged, one link lost
    node.write(scenario)
    code, report, stderr = health_json(node)
    assert code == 76, stderr
    assert "GPU1 UNHEALTHY: degraded: NVLink 3 of 4 links active" in stderr
    assert [g["verdict"] for g in report["gpus"]] == ["healthy", "unhealthy", "healthy", "healthy"]


def test_an_hgx_gpu_with_all_links_down_beside_healthy_peers_is_caught(node):
    node.write(sc.nvlink_down(gpu=5, links=tuple(range(18))))
    code, _, stderr = health_json(node)
    assert code == 76 and "GPU5 UNHEALTHY: degraded: NVLink 0 of 18 links active, other GPUs" in stderr


# --- 2. a GPU that was never probed does not pass -------------------------------------------------------------


def test_a_gpu_busy_in_the_first_snapshot_and_clean_after_the_probes_does_not_pass(node, tmp_path):
    holder = node.spawn_holder(2, 4096)
    kill = f'[ "$PODGUARD_PROBE_GPU_INDEX" = 0 ] && kill -9 {holder.pid} && sleep 0.5\n'
    program = probe_program(tmp_path, {}, H100_SXM, extra=kill)
    code, report, stderr = health_json(node, program)
    holder.wait(timeout=10)
    assert code == 75, stderr  # busy: a retry may pass, once it is free AND measured
    gpu2 = report["gpus"][2]
    assert gpu2["verdict"] == "busy" and gpu2["metrics"] == {}
    verdict = report["gate"]["verdicts"][2]
    assert verdict["probe"] is None and "not probed: it was busy when the probes started" in verdict["reasons"]
    assert all(g["verdict"] == "healthy" and g["metrics"] for g in report["gpus"] if g["index"] != 2)


# --- 3. floors that hold on every host ------------------------------------------------------------------------


def test_an_h100_pcie_in_a_gen4_server_with_normal_copies_passes(node, tmp_path):
    scenario = sc.without_nvlink(count=4)
    for g in scenario.gpus:
        g.pcie_gen = g.pcie_gen_max = 4
    node.write(scenario)
    metrics = {
        i: {"matmul_tflops": 600.0, "mem_gbps": 1900.0, "h2d_gbps": h2d} for i, h2d in enumerate((22, 24, 26, 23))
    }
    code, report, stderr = health_json(node, probe_program(tmp_path, metrics, metrics[0]))
    assert code == 0, stderr
    assert [g["metrics"]["h2d_gbps"] for g in report["gpus"]] == [22, 24, 26, 23]


def test_the_same_copies_on_a_gen5_host_are_slow(node, tmp_path):
    node.write(sc.without_nvlink(count=2))  # H100 PCIe on a Gen5 x16 link: 22 GB/s is under half of it
    slow = {"matmul_tflops": 600.0, "mem_gbps": 1900.0, "h2d_gbps": 22.0}
    code, _, stderr = health_json(node, probe_program(tmp_path, {}, slow))
    assert code == 76, stderr
    assert "h2d_gbps 22.0 GB/s is below the floor 23.9 GB/s for a PCIe gen 5 x16 host link" in stderr


def test_a_mig_slice_is_not_held_to_a_whole_gpus_floors(node, tmp_path):
    node.write(sc.mig_enabled(gpu=0, devices=2, count=2))
    one_g = {"matmul_tflops": 95.0, "mem_gbps": 400.0, "h2d_gbps": 9.0}
    code, report, stderr = health_json(node, probe_program(tmp_path, {0: one_g}, H100_SXM))
    assert code == 0, stderr
    assert report["gpus"][0]["metrics"]["matmul_tflops"] == 95.0 and report["gpus"][0]["degraded"] == []


# --- 4. one read is not a verdict -----------------------------------------------------------------------------


@pytest.mark.parametrize("probe", ["off", "cmd"])
def test_a_slowdown_bit_seen_in_one_read_only_does_not_fail_a_healthy_gpu(node, tmp_path, probe):
    # two reads see the bit: the inventory's and the gate's first; the gate reads once more and it is gone
    node.write(sc.transient_clock_events(gpu=3, events=sc.CLOCK_GPU_IDLE | sc.CLOCK_HW_SLOWDOWN, reads=2))
    program = probe_program(tmp_path, {}, H100_SXM) if probe == "cmd" else None
    t = time.monotonic()
    code, report, stderr = health_json(node, program)
    assert code == 0, stderr
    assert report["gpus"][3]["degraded"] == [] and report["gpus"][3]["verdict"] == "healthy"
    assert time.monotonic() - t < 15


def test_a_slowdown_bit_that_appears_right_after_the_probe_and_clears_does_not_fail(node, tmp_path):
    node.write(sc.healthy_h100(2))
    after = sc.transient_clock_events(gpu=1, events=sc.CLOCK_GPU_IDLE | sc.CLOCK_HW_SLOWDOWN, reads=1, count=2)
    staged = tmp_path / "after.txt"
    after.write(staged)
    target = node.scenario_path
    swap = f'[ "$PODGUARD_PROBE_GPU_INDEX" = 1 ] && cp {staged} {target}.new && mv {target}.new {target}\n'
    code, report, stderr = health_json(node, probe_program(tmp_path, {}, H100_SXM, extra=swap))
    assert code == 0, stderr
    assert report["gpus"][1]["degraded"] == []


def test_a_persistent_slowdown_bit_still_fails_and_names_its_cause_once(node):
    node.write(sc.clock_events(gpu=3, events=sc.CLOCK_GPU_IDLE | sc.CLOCK_HW_SLOWDOWN | sc.CLOCK_HW_POWER_BRAKE))
    code, report, stderr = health_json(node)
    assert code == 76, stderr
    assert [d["code"] for d in report["gpus"][3]["degraded"]] == ["hw_power_brake"]
    assert stderr.count("GPU3 UNHEALTHY: degraded:") == 1


def test_doctor_does_not_report_a_one_read_slowdown_bit(node):
    node.write(sc.transient_clock_events(gpu=3, events=sc.CLOCK_GPU_IDLE | sc.CLOCK_HW_SLOWDOWN, reads=1))
    proc = run_pg(node, ["doctor", "--json"])
    assert proc.returncode == 0, proc.stderr
    health = json.loads(proc.stdout)["health"]
    assert health[3]["degraded"] == [] and health[3]["verdict"] == "healthy"


# --- 5. PODGUARD_SLOW_RATIO=0 ---------------------------------------------------------------------------------


def test_a_slow_ratio_of_zero_turns_the_relative_check_off(node, tmp_path):
    program = probe_program(tmp_path, {5: {"matmul_tflops": 0.65 * 800}}, H100_SXM)
    assert health_json(node, program)[0] == 76
    code, report, stderr = health_json(node, program, PODGUARD_SLOW_RATIO="0")
    assert code == 0, stderr
    assert report["gpus"][5]["degraded"] == []
