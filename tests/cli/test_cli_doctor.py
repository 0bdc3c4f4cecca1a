"""`podguard doctor` on the fake node: holders per GPU, verdicts, env sections, secrets never printed."""

from __future__ import annotations

import json
import subprocess
import sys

from fakenvml import scenario as sc

SECRET = "rp_live_do_not_print_0123456789abcdef"


def doctor(node, tmp_path, *args, **env):
    full = {**node.env, "PODGUARD_STATE_DIR": str(tmp_path / "state"), "RUNPOD_API_KEY": SECRET, **env}
    return subprocess.run(
        [sys.executable, "-m", "podguard", "doctor", *args], env=full, capture_output=True, text=True, timeout=60
    )


def test_doctor_names_holders_verdicts_and_recommendations_without_secrets(nvml_node, tmp_path):
    nvml_node.write(sc.ecc_and_remap(ecc_gpu=1, remap_gpu=2))
    holder = nvml_node.spawn_holder(0, 2048)
    proc = doctor(nvml_node, tmp_path, RUNPOD_POD_ID="pod42", LOCAL_RANK="11", WORLD_SIZE="16")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert SECRET not in out + proc.stderr
    assert "RUNPOD_API_KEY present" in out and "RUNPOD_POD_ID=pod42" in out
    assert f"held by pid {holder.pid}" in out
    assert "GPU1" in out and "[unhealthy]" in out
    assert "LOCAL_RANK=11 but only 8 GPU(s)" in out
    assert holder.poll() is None  # doctor only reads
    data = json.loads(doctor(nvml_node, tmp_path, "--json").stdout)
    assert SECRET not in json.dumps(data)
    assert data["secrets"]["RUNPOD_API_KEY"] == "present"
    assert {v["index"]: v["verdict"] for v in data["health"]}[2] == "unhealthy"


def test_doctor_on_a_cpu_node_and_a_mismatched_driver_explains_instead_of_crashing(nvml_node, tmp_path):
    cpu = doctor(nvml_node, tmp_path, LD_LIBRARY_PATH="")
    assert cpu.returncode == 0 and "NVML unavailable (library_not_found)" in cpu.stdout
    nvml_node.write(sc.version_mismatch())
    bad = doctor(nvml_node, tmp_path)
    assert bad.returncode == 0 and "version mismatch" in bad.stdout
    assert "Traceback" not in bad.stderr


def test_doctor_table_puts_the_reason_next_to_a_degraded_gpu_and_shows_the_last_metrics(nvml_node, tmp_path):
    nvml_node.write(sc.pcie_link(gpu=3, width=8))
    program = tmp_path / "measure.py"
    program.write_text(
        f"#!{sys.executable}\nimport json, os\n"
        "print(json.dumps({'matmul_tflops': 700 + int(os.environ['PODGUARD_PROBE_GPU_INDEX']), 'h2d_gbps': 53.12}))\n"
    )
    program.chmod(0o755)
    env = {**nvml_node.env, "PODGUARD_STATE_DIR": str(tmp_path / "state"), "PODGUARD_PROBE_CMD": str(program)}
    health = subprocess.run(
        [sys.executable, "-m", "podguard", "health", "--probe", "cuda", "--degraded", "warn"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert health.returncode == 0, health.stderr
    proc = doctor(nvml_node, tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines() if line.strip()[:1].isdigit()}
    assert rows["3"].rstrip().endswith("degraded: PCIe link x8 of x16 (a narrow link: seat, riser or slot)")
    assert "unhealthy" in rows["3"] and "x8/16 g5/5" in rows["3"] and " 703 " in rows["3"]
    assert "healthy" in rows["2"] and "degraded" not in rows["2"] and "53.1" in rows["2"]
    data = json.loads(doctor(nvml_node, tmp_path, "--json").stdout)
    assert data["metrics"]["gpus"]["3"] == {"matmul_tflops": 703.0, "h2d_gbps": 53.12}
    assert data["health"][3]["degraded"][0]["code"] == "pcie_width"
    warned = doctor(nvml_node, tmp_path, PODGUARD_DEGRADED="exclude")
    assert "GPU3 is degraded (degraded: PCIe link x8 of x16" in warned.stdout
