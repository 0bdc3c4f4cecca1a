"""End to end: slow GPUs found from probe metrics. `podguard health` runs as a real subprocess on the fake 8xH100
node; a PODGUARD_PROBE_CMD program reports its GPU's metrics as one JSON line, like the built-in CUDA probe."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fakenvml import scenario as sc

PODGUARD = [sys.executable, "-m", "podguard"]
# A healthy H100 SXM's metrics, comfortably above its floors (480 TFLOP/s, 2000 GB/s, 24 GB/s)
HEALTHY = {"matmul_tflops": 800.0, "mem_gbps": 3000.0, "h2d_gbps": 50.0}


@pytest.fixture
def node(cli_node):
    return cli_node


def run_health(node, program: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {**node.env, "PODGUARD_PROBE": "cuda", "PODGUARD_PROBE_CMD": str(program), **env}
    return subprocess.run(
        [*PODGUARD, "health", "--json"],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def metrics_program(tmp_path: Path, per_gpu: dict[int, dict[str, float]], default: dict[str, float] = HEALTHY) -> Path:
    """A probe program printing, for the GPU it is run for, per_gpu[index] (else `default`) as its JSON line."""
    table = {str(i): m for i, m in per_gpu.items()}
    path = tmp_path / "measure.sh"
    lines = [f"  {i}) echo '{json.dumps({**default, **m})}' ;;" for i, m in table.items()]
    path.write_text(
        "#!/bin/sh\n"
        'case "$PODGUARD_PROBE_GPU_INDEX" in\n' + "\n".join(lines) + f"\n  *) echo '{json.dumps(default)}' ;;\nesac\n"
    )
    path.chmod(0o755)
    return path


def report_of(proc: subprocess.CompletedProcess[str]) -> dict:
    return json.loads(proc.stdout)["report"]


def test_one_gpu_at_65_percent_of_the_median_is_unhealthy(node, tmp_path):
    program = metrics_program(tmp_path, {5: {"matmul_tflops": 0.65 * 800}})
    proc = run_health(node, program)
    assert proc.returncode == 76, proc.stderr
    assert proc.stderr.splitlines()[0].startswith("podguard health: UNHEALTHY on 8 GPU(s)"), proc.stderr
    assert "GPU5 UNHEALTHY: degraded: matmul_tflops 520 TFLOP/s is below 0.8 x the median of 8 GPUs" in proc.stderr
    gpus = {g["index"]: g for g in report_of(proc)["gpus"]}
    (finding,) = gpus[5]["degraded"]
    assert finding["code"] == "slow" and finding["values"]["metric"] == "matmul_tflops"
    assert gpus[5]["metrics"]["matmul_tflops"] == 520.0
    assert all(gpus[i]["verdict"] == "healthy" and gpus[i]["degraded"] == [] for i in gpus if i != 5)


def test_all_within_5_percent_pass(node, tmp_path):
    spread = {i: {k: v * (0.95 + 0.007 * i) for k, v in HEALTHY.items()} for i in range(8)}  # 95 % .. 100 %
    proc = run_health(node, metrics_program(tmp_path, spread))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("podguard health: PASS"), proc.stderr
    for gpu in report_of(proc)["gpus"]:
        assert gpu["degraded"] == [] and gpu["verdict"] == "healthy"
        assert set(gpu["metrics"]) == set(HEALTHY)


def test_the_slow_ratio_is_honoured(node, tmp_path):
    program = metrics_program(tmp_path, {2: {"mem_gbps": 0.85 * 3000}})
    assert run_health(node, program).returncode == 0  # 85 % of the median passes 0.8
    proc = run_health(node, program, PODGUARD_SLOW_RATIO="0.9")
    assert proc.returncode == 76, proc.stderr
    assert "GPU2 UNHEALTHY: degraded: mem_gbps 2550 GB/s is below 0.9 x the median of 8 GPUs" in proc.stderr


def test_eight_equally_slow_gpus_are_caught_by_the_model_floor(node, tmp_path):
    program = metrics_program(tmp_path, {}, default={**HEALTHY, "mem_gbps": 1500.0})
    proc = run_health(node, program)
    assert proc.returncode == 76, proc.stderr
    for i in range(8):
        assert (
            f"GPU{i} UNHEALTHY: degraded: mem_gbps 1500 GB/s is below the floor 2000 GB/s for H100 SXM" in proc.stderr
        )


def test_an_unknown_model_gets_the_relative_check_only(node, tmp_path):
    scenario = sc.healthy_h100()
    for gpu in scenario.gpus:
        gpu.name = "NVIDIA Future GPU 9000"
    node.write(scenario)
    program = metrics_program(tmp_path, {}, default={**HEALTHY, "mem_gbps": 1500.0})
    assert run_health(node, program).returncode == 0, "no floor for an unknown model"
    program = metrics_program(tmp_path, {6: {"mem_gbps": 700.0}}, default={**HEALTHY, "mem_gbps": 1500.0})
    proc = run_health(node, program)
    assert proc.returncode == 76, proc.stderr
    assert "GPU6 UNHEALTHY: degraded: mem_gbps 700 GB/s is below 0.8 x the median" in proc.stderr


def test_warn_passes_a_slow_gpu_with_its_reason(node, tmp_path):
    program = metrics_program(tmp_path, {1: {"mem_gbps": 2200.0}})  # above the floor (2000), below 0.8 x 3000
    proc = run_health(node, program, PODGUARD_DEGRADED="warn")
    assert proc.returncode == 0, proc.stderr
    assert "mem_gbps 2200 GB/s is below 0.8 x the median of 8 GPUs" in proc.stderr
    assert [d["code"] for d in report_of(proc)["gpus"][1]["degraded"]] == ["slow"]


def test_probes_run_in_parallel(node, tmp_path):
    program = tmp_path / "slow-probe.sh"
    program.write_text(f"#!/bin/sh\nsleep 1.5\necho '{json.dumps(HEALTHY)}'\n")
    program.chmod(0o755)
    started = time.monotonic()
    proc = run_health(node, program)
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    durations = [v["probe"]["duration_ms"] for v in report_of(proc)["gate"]["verdicts"]]
    assert len(durations) == 8 and min(durations) >= 1500
    assert elapsed < 7.0, f"8 probes of 1.5 s took {elapsed:.1f}s in all: not parallel (one after another: 12 s)"
