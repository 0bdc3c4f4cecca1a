"""End to end: degraded GPUs on the fake node (`podguard health|run` as real subprocesses against the fake
libnvidia-ml.so.1), the --degraded policies, and probe metrics from a PODGUARD_PROBE_CMD program's JSON line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fakenvml import scenario as sc

PODGUARD = [sys.executable, "-m", "podguard"]


def run_pg(node, args: list[str], *, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**node.env, **(env or {})}
    return subprocess.run(
        [*PODGUARD, *args], env=full_env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )


def latest_report(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "state" / "reports" / "latest.json").read_text())


@pytest.fixture
def node(cli_node):
    return cli_node


DEGRADED = [
    (sc.clock_events(gpu=3, events=sc.CLOCK_GPU_IDLE | sc.CLOCK_HW_SLOWDOWN), "hw_slowdown", "clock slowdown"),
    (sc.clock_events(gpu=3, events=sc.CLOCK_HW_THERMAL), "hw_thermal_slowdown", "thermal slowdown"),
    (sc.clock_events(gpu=3, events=sc.CLOCK_HW_POWER_BRAKE), "hw_power_brake", "power brake"),
    (sc.hot(gpu=3, above_c=2), "temperature", "temperature 89C at/above its slowdown threshold 87C"),
    (sc.pcie_link(gpu=3, width=8), "pcie_width", "PCIe link x8 of x16"),
    (sc.nvlink_down(gpu=3, links=(0, 7)), "nvlink_down", "NVLink 16 of 18 links active"),
]


@pytest.mark.parametrize(("scenario", "code", "needle"), DEGRADED, ids=[d[1] for d in DEGRADED])
def test_each_degraded_condition_is_76_naming_the_gpu_and_the_reason(node, tmp_path, scenario, code, needle):
    node.write(scenario)
    proc = run_pg(node, ["health"])
    assert proc.returncode == 76, proc.stderr
    first = proc.stderr.splitlines()[0]
    assert first.startswith("podguard health: UNHEALTHY on 8 GPU(s)"), first
    assert "GPU3 UNHEALTHY: degraded: " in proc.stderr and needle in proc.stderr, proc.stderr
    report = latest_report(tmp_path)
    gpus = {g["index"]: g for g in report["gpus"]}
    assert [d["code"] for d in gpus[3]["degraded"]] == [code]
    assert gpus[3]["verdict"] == "unhealthy" and all(gpus[i]["degraded"] == [] for i in gpus if i != 3)


NORMAL = [
    (sc.clock_events(gpu=2, events=sc.CLOCK_GPU_IDLE), "idle clocks"),
    (sc.clock_events(gpu=2, events=sc.CLOCK_SW_POWER_CAP | sc.CLOCK_SW_THERMAL), "SW power cap"),
    (sc.pcie_link(gpu=2, width=16, gen=1), "PCIe gen 1 of 5 at idle"),
    (sc.without_nvlink(), "GPUs without NVLink"),
    (sc.fields_unsupported(2), "consumer boards: no NVLink, ECC n/a"),
]


@pytest.mark.parametrize(("scenario", "why"), NORMAL, ids=[n[1] for n in NORMAL])
def test_normal_conditions_pass(node, tmp_path, scenario, why):
    node.write(scenario)
    proc = run_pg(node, ["health", "--json"])
    assert proc.returncode == 0, (why, proc.stderr)
    report = json.loads(proc.stdout)["report"]
    assert all(g["degraded"] == [] and g["verdict"] == "healthy" for g in report["gpus"]), why


def test_pcie_generation_and_nvlink_state_are_read_not_judged(node, tmp_path):
    node.write(sc.pcie_link(gpu=2, width=16, gen=1))
    gpus = json.loads(run_pg(node, ["gpus", "--json"]).stdout)["gpus"]
    assert (gpus[2]["pcie_link_gen"], gpus[2]["pcie_link_gen_max"]) == (1, 5)
    assert (gpus[2]["nvlink_links"], gpus[2]["nvlink_active"]) == (18, 18)


def test_warn_passes_with_a_warning_line(node, tmp_path):
    node.write(sc.pcie_link(gpu=5, width=4))
    proc = run_pg(node, ["health", "--degraded", "warn"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("podguard health: PASS on 8 GPU(s)")
    assert "GPU5 warning: degraded: PCIe link x4 of x16" in proc.stderr
    assert latest_report(tmp_path)["gpus"][5]["degraded"][0]["values"] == {"width": 4, "max_width": 16}


def test_exclude_runs_on_the_rest_and_names_what_was_excluded_and_why(node, tmp_path):
    node.write(sc.nvlink_down(gpu=6, links=(1,)))
    uuids = [g["uuid"] for g in json.loads(run_pg(node, ["gpus", "--json"]).stdout)["gpus"]]
    show = [sys.executable, "-c", "import os; print('CVD=' + os.environ['CUDA_VISIBLE_DEVICES'])"]
    proc = run_pg(node, ["run", "--", *show], env={"PODGUARD_DEGRADED": "exclude", "RUNPOD_GPU_COUNT": "7"})
    assert proc.returncode == 0, proc.stderr
    assert "PASS on 7 GPU(s)" in proc.stderr.splitlines()[0]
    assert "GPU6 EXCLUDED: degraded: NVLink 17 of 18 links active" in proc.stderr
    assert "excluded degraded GPU(s) 6 (GPU6 NVLink 17 of 18 links active); running on GPU(s) 0,1,2,3,4,5,7" in (
        proc.stderr
    )
    assert f"CVD={','.join(u for i, u in enumerate(uuids) if i != 6)}" in proc.stdout
    report = latest_report(tmp_path)
    assert [g["index"] for g in report["selection"]["gpus"]] == [0, 1, 2, 3, 4, 5, 7]
    assert report["gpus"][6]["verdict"] == "excluded" and report["gpus"][6]["degraded"][0]["code"] == "nvlink_down"


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"NPROC_PER_NODE": "8"}, "fewer than NPROC_PER_NODE=8 needs"),
        ({"RUNPOD_GPU_COUNT": "8"}, "fewer than the expected 8 GPUs (RUNPOD_GPU_COUNT / --expect-gpus) needs"),
        ({"GPU_LIST": "1"}, "0 GPU(s) left, nothing to run on"),
    ],
)
def test_exclude_with_the_expected_count_no_longer_met_is_69(node, tmp_path, env, needle):
    node.write(sc.hot(gpu=1))
    proc = run_pg(node, ["health", "--degraded", "exclude"], env=env)
    assert proc.returncode == 69, proc.stderr
    assert proc.stderr.splitlines()[0].startswith("podguard health: FAIL on")
    assert "excluded degraded GPU(s) 1 (GPU1 temperature 87C at/above its slowdown threshold 87C)" in proc.stderr
    assert needle in proc.stderr
    assert "too few GPUs left after excluding" in proc.stderr


def test_exclude_below_the_count_continues_loudly_when_asked(node, tmp_path):
    node.write(sc.hot(gpu=1))
    env = {"NPROC_PER_NODE": "8", "PODGUARD_ON_FEWER_GPUS": "continue", "PODGUARD_DEGRADED": "exclude"}
    proc = run_pg(node, ["health"], env=env)
    assert proc.returncode == 0, proc.stderr
    assert "FEWER GPUS THAN EXPECTED: NPROC_PER_NODE=8; continuing with 7" in proc.stderr


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (["health"], {"PODGUARD_DEGRADED": "sometimes"}, "PODGUARD_DEGRADED='sometimes' is not valid"),
        (["run", "--degraded", "ignore", "--", "true"], {}, "PODGUARD_DEGRADED='ignore'"),
        (["health"], {"PODGUARD_SLOW_RATIO": "-0.1"}, "PODGUARD_SLOW_RATIO=-0.1 is not valid"),
        (["health", "--slow-ratio", "1.5"], {}, "PODGUARD_SLOW_RATIO=1.5 is not valid"),
        (["health"], {"PODGUARD_SLOW_RATIO": "fast"}, "PODGUARD_SLOW_RATIO='fast' is not a number"),
        (["health"], {"PODGUARD_PROBE": "fullest"}, "PODGUARD_PROBE='fullest' is not valid; choose one of"),
        (["doctor"], {"PODGUARD_DEGRADED": "x"}, "PODGUARD_DEGRADED='x'"),
    ],
)
def test_bad_values_of_the_new_variables_are_64_naming_them(node, args, env, needle):
    proc = run_pg(node, args, env=env)
    assert proc.returncode == 64, (proc.returncode, proc.stderr)
    assert needle in proc.stderr and "Traceback" not in proc.stderr
    assert len([line for line in proc.stderr.splitlines() if "error" in line.lower()]) == 1


def probe_program(tmp_path: Path, body: str) -> Path:
    """A PODGUARD_PROBE_CMD program: it prints its GPU's metrics as its last JSON line."""
    path = tmp_path / "measure.py"
    path.write_text(f"#!{sys.executable}\nimport json, os\nindex = int(os.environ['PODGUARD_PROBE_GPU_INDEX'])\n{body}")
    path.chmod(0o755)
    return path


def test_metrics_from_a_probe_programs_json_line_reach_the_report_and_health_json(node, tmp_path):
    program = probe_program(
        tmp_path,
        "print('warming up {not json}')\n"
        "print(json.dumps({'matmul_tflops': 100.0 + index, 'mem_gbps': 3000}))\n"
        "print(json.dumps({'matmul_tflops': 700.0 + index, 'mem_gbps': 3000, 'h2d_gbps': 50.5,\n"
        "                  'note': 'text is not a metric', 'allreduce_busbw_gbps': float('nan')}))\n",
    )
    proc = run_pg(node, ["health", "--json"], env={"PODGUARD_PROBE_CMD": str(program), "PODGUARD_PROBE": "cuda"})
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)["report"]
    for gpu in report["gpus"]:
        assert gpu["metrics"] == {"matmul_tflops": 700.0 + gpu["index"], "mem_gbps": 3000.0, "h2d_gbps": 50.5}
    assert report["gate"]["verdicts"][4]["probe"]["metrics"]["matmul_tflops"] == 704.0
    assert latest_report(tmp_path)["gpus"][7]["metrics"]["h2d_gbps"] == 50.5


def test_a_failing_probe_programs_metrics_are_kept_and_its_exit_code_decides(node, tmp_path):
    program = probe_program(
        tmp_path,
        "if index == 2:\n    print(json.dumps({'ok': True, 'mem_gbps': 10}))\n    raise SystemExit(3)\n",
    )
    proc = run_pg(node, ["health", "--json"], env={"PODGUARD_PROBE_CMD": str(program), "PODGUARD_PROBE": "cuda"})
    assert proc.returncode == 76, proc.stderr
    report = json.loads(proc.stdout)["report"]
    assert report["gpus"][2]["verdict"] == "unhealthy" and report["gpus"][2]["metrics"] == {"mem_gbps": 10.0}
    assert report["gpus"][1]["verdict"] == "healthy" and report["gpus"][1]["metrics"] == {}


def test_full_mode_is_accepted_and_records_the_node_all_reduce(node, tmp_path):
    program = probe_program(tmp_path, "print(json.dumps({'ok': True}))\n")
    env = {"PODGUARD_PROBE_CMD": str(program), "PODGUARD_PROBE": "full", "GPU_LIST": "0"}
    proc = run_pg(node, ["health", "--json"], env=env)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)["report"]
    assert report["gate"]["allreduce"]["skipped"] == "an all-reduce needs two or more GPUs"
