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
