"""End to end: the `podguard` command as a user runs it, against the fake libnvidia-ml.so.1.

Each test starts `python -m podguard ...` as a real subprocess that finds the fake NVML library through
LD_LIBRARY_PATH (the real `nvidia-ml-py` binding loads it), with real stand-in GPU processes holding
the fake device files. These are the issue's scenarios, checked by exit code, output and what is still
alive afterwards.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fakenvml import scenario as sc
from fakenvml.holders import pid_alive

PODGUARD = [sys.executable, "-m", "podguard"]


def run_pg(node, args: list[str], *, env: dict[str, str] | None = None, timeout: float = 60.0):
    full_env = {**node.env, **(env or {})}
    return subprocess.run(
        [*PODGUARD, *args], env=full_env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


@pytest.fixture
def node(cli_node):
    return cli_node


def latest_report(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "state" / "reports" / "latest.json").read_text())


def test_gpus_json_lists_8_h100_and_children_get_uuids(node):
    proc = run_pg(node, ["gpus", "--json"])
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert len(data["gpus"]) == 8
    assert data["gpus"][0]["name"].startswith("NVIDIA H100")
    uuids = [g["uuid"] for g in data["gpus"]]
    assert data["selection"]["child_env"]["CUDA_VISIBLE_DEVICES"] == ",".join(uuids)
    human = run_pg(node, ["gpus"], env={"GPU_LIST": "2,5"})
    assert human.returncode == 0 and "selected (GPU_LIST): 2,5" in human.stdout


def test_healthy_node_passes_fast_and_writes_a_report(node, tmp_path):
    proc = run_pg(node, ["run", "--", "true"])
    assert proc.returncode == 0, proc.stderr
    report = latest_report(tmp_path)
    assert report["verdict"] == "pass"
    assert [v["verdict"] for v in report["gate"]["verdicts"]] == ["healthy"] * 8
    assert report["timings_ms"]["total"] < 1000
    assert "PASS on 8 GPU(s)" in proc.stderr


def test_four_gpus_when_eight_expected_is_69_or_continues_loudly(node):
    node.write(sc.fewer_gpus(4))
    proc = run_pg(node, ["run", "--", "true"], env={"RUNPOD_GPU_COUNT": "8"})
    assert proc.returncode == 69
    assert "expected 8 GPUs but this node has 4" in proc.stderr
    ok = run_pg(node, ["run", "--on-fewer-gpus", "continue", "--", "true"], env={"RUNPOD_GPU_COUNT": "8"})
    assert ok.returncode == 0, ok.stderr
    assert "FEWER GPUS THAN EXPECTED" in ok.stderr


def test_exclusive_gpu_held_by_respawning_launcher_tree_is_cleaned_launcher_first(node, tmp_path):
    node.write(sc.exclusive_process(gpu=0))
    holder = node.spawn_holder(0, 4096, respawn_worker=True)
    worker = holder.holder_pid
    proc = run_pg(node, ["run", "--grace", "2", "--", "true"])
    assert proc.returncode == 0, proc.stderr + proc.stdout
    holder.wait(timeout=5)
    assert not pid_alive(worker)
    kills = latest_report(tmp_path)["cleanup"]["killed"]
    killed = [k["pid"] for k in kills]
    assert holder.pid in killed and worker in killed
    assert killed.index(holder.pid) < killed.index(worker)  # launcher first: no respawn
    assert re.search(rf"(terminated|killed) pid {worker} \(.*\) on GPU 0, holding 4096 MiB: ", proc.stderr), proc.stderr


def test_sigterm_ignoring_holder_and_its_forked_child_are_stopped(node, tmp_path):
    holder = node.spawn_holder(1, 2048, ignore_sigterm=True, fork_child_holder=True)
    child = holder.child_pid
    started = time.monotonic()
    proc = run_pg(node, ["run", "--grace", "0.5", "--", "true"])
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    holder.wait(timeout=5)
    assert child is not None and not pid_alive(child)
    outcomes = {k["pid"]: k["outcome"] for k in latest_report(tmp_path)["cleanup"]["killed"]}
    assert outcomes[holder.pid] == "killed"  # needed SIGKILL
    assert elapsed < 10


def test_foreign_pid_and_protected_processes_survive_and_the_gate_says_busy(node, tmp_path):
    bystander = subprocess.Popen(["sleep", "60"])  # an unrelated local process that NVML "reports"
    try:
        node.register(bystander.pid, 2, 1024)
        sshd = node.spawn_holder(3, 512, name="sshd")
        monitor = node.spawn_holder(4, 0, monitor=True)
        proc = run_pg(node, ["run", "--busy-timeout", "0.5", "--", "true"])
        assert proc.returncode == 75, proc.stderr
        assert bystander.poll() is None and sshd.poll() is None and monitor.poll() is None
        report = latest_report(tmp_path)
        verdicts = {v["index"]: v["verdict"] for v in report["gate"]["verdicts"]}
        assert verdicts[2] == "busy" and verdicts[3] == "busy" and verdicts[4] == "healthy"
        assert report["cleanup"]["killed"] == []
        assert "still busy" in proc.stderr
    finally:
        bystander.kill()
        bystander.wait()


def test_no_cleanup_kills_nothing_but_waits_for_the_gpu_to_come_free(node):
    holder = node.spawn_holder(1, 2048)
    proc = run_pg(node, ["run", "--no-cleanup", "--busy-timeout", "0.3", "--", "true"])
    assert proc.returncode == 75 and holder.poll() is None
    waiter = subprocess.Popen(
        [*PODGUARD, "run", "--no-cleanup", "--busy-timeout", "20", "--", "true"],
        env=node.env,
        stderr=subprocess.PIPE,
        text=True,
    )
    holder.terminate()  # the holder goes away by itself while podguard waits
    _, err = waiter.communicate(timeout=30)
    assert waiter.returncode == 0, err


def test_phantom_memory_is_busy_75_with_pod_restart_advice(node):
    node.write(sc.phantom_memory(gpu=2))
    started = time.monotonic()
    proc = run_pg(node, ["run", "--busy-timeout", "0.5", "--", "true"])
    assert proc.returncode == 75
    assert "phantom" in proc.stderr and "stop and start the pod" in proc.stderr
    assert time.monotonic() - started < 15


def test_ecc_and_row_remap_fail_health_with_76_naming_each_gpu(node):
    node.write(sc.ecc_and_remap(ecc_gpu=1, remap_gpu=2))
    proc = run_pg(node, ["health", "--json"])
    assert proc.returncode == 76
    verdicts = {v["index"]: v for v in json.loads(proc.stdout)["report"]["gate"]["verdicts"]}
    assert verdicts[1]["verdict"] == "unhealthy" and "ECC" in " ".join(verdicts[1]["reasons"])
    assert verdicts[2]["verdict"] == "unhealthy" and "remap" in " ".join(verdicts[2]["reasons"])
    assert verdicts[0]["verdict"] == "healthy"
    # excluding the bad GPUs lets the job start
    assert run_pg(node, ["health"], env={"GPU_LIST": "0,3"}).returncode == 0


@pytest.mark.parametrize(
    ("scenario", "code", "needle"),
    [
        (sc.lost_gpu(gpu=5), 76, "GPU5"),
        (sc.version_mismatch(), 76, "version mismatch"),
        (sc.driver_not_loaded(), 76, "driver is not loaded"),
        (sc.retired_pages(gpu=3), 76, "retired pages pending"),
    ],
)
def test_hardware_and_driver_failures_are_76(node, scenario, code, needle):
    node.write(scenario)
    proc = run_pg(node, ["health"])
    assert proc.returncode == code, proc.stderr
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr


def test_no_driver_is_cpu_fallback_unless_gpus_are_required(node):
    env = {"LD_LIBRARY_PATH": ""}
    proc = run_pg(node, ["health"], env=env)
    assert proc.returncode == 0 and "CPU only" in proc.stderr
    required = run_pg(node, ["health", "--require-gpu"], env=env)
    assert required.returncode == 69 and "no GPU on this node" in required.stderr


def test_user_probe_command_failing_on_one_gpu_is_76(node, tmp_path):
    bad_uuid = json.loads(run_pg(node, ["gpus", "--json"]).stdout)["gpus"][3]["uuid"]
    probe = tmp_path / "probe.sh"
    probe.write_text(f'#!/bin/sh\n[ "$CUDA_VISIBLE_DEVICES" != "{bad_uuid}" ] || {{ echo bad matmul; exit 3; }}\n')
    probe.chmod(0o755)
    proc = run_pg(node, ["health", "--json"], env={"PODGUARD_PROBE_CMD": str(probe), "PODGUARD_PROBE": "cuda"})
    assert proc.returncode == 76, proc.stderr
    verdicts = {v["index"]: v["verdict"] for v in json.loads(proc.stdout)["report"]["gate"]["verdicts"]}
    assert verdicts[3] == "unhealthy" and list(verdicts.values()).count("healthy") == 7


def test_xid_during_the_probe_window_marks_the_gpu_unhealthy(node, tmp_path):
    node.write(sc.xid(gpu=3, code=79, after_ms=50))
    probe = tmp_path / "slow_probe.sh"
    probe.write_text("#!/bin/sh\nsleep 0.4\n")
    probe.chmod(0o755)
    proc = run_pg(node, ["health"], env={"PODGUARD_PROBE_CMD": str(probe), "PODGUARD_PROBE": "cuda"})
    assert proc.returncode == 76, proc.stderr
    assert "XID 79" in proc.stderr


def test_cleanup_dry_run_kills_nothing_and_reports_the_plan(node, tmp_path):
    holder = node.spawn_holder(6, 1024)
    proc = run_pg(node, ["cleanup", "--dry-run", "--json"])
    assert holder.poll() is None
    report = json.loads(proc.stdout)["report"]
    planned = report["cleanup"]["planned"]
    assert report["cleanup"]["dry_run"] is True and report["cleanup"]["killed"] == []
    assert f"would stop pid {holder.pid}" in proc.stderr
    assert str(holder.pid) in json.dumps(planned)
    real = run_pg(node, ["cleanup", "--grace", "1"])
    assert real.returncode == 0, real.stderr
    holder.wait(timeout=5)


def test_cleanup_never_touches_a_gpu_leased_by_a_running_podguard_job(node, tmp_path):
    """Two runs on one host: the second one's cleanup must not kill the first one's worker."""
    state = str(tmp_path / "state")
    # a GPU-holding job launched by podguard with a lease on GPU 0
    job = subprocess.Popen(
        [*PODGUARD, "run", "--", "sleep", "30"],
        env={**node.env, "GPU_LIST": "0", "PODGUARD_STATE_DIR": state},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        leases = Path(state) / "leases" / "gpus"
        while time.monotonic() < deadline and not any(p.stat().st_size for p in leases.glob("*.lock")):
            time.sleep(0.05)
        sleeper = node.spawn_holder(0, 1024)  # stands in for the job's worker holding GPU 0
        clean = run_pg(node, ["cleanup", "--busy-timeout", "0.3"], env={"PODGUARD_STATE_DIR": state})
        assert sleeper.poll() is None, "cleanup killed a process on a GPU leased by another podguard run"
        assert "GPU 0 skipped: leased by" in clean.stderr
        second = run_pg(node, ["run", "--", "true"], env={"GPU_LIST": "0", "PODGUARD_STATE_DIR": state})
        assert second.returncode == 75 and "GPU 0 is leased by" in second.stderr
        assert sleeper.poll() is None
    finally:
        job.send_signal(signal.SIGTERM)
        assert job.wait(timeout=20) == 143


BAD_INPUT = [
    (["run", "--", "true"], {"GPU_LIST": "0,9"}, "GPU index 9 does not exist"),
    (["run", "--", "true"], {"GPU_LIST": "1,1"}, "listed twice"),
    (["run", "--", "true"], {"GPU_LIST": "gpu0"}, "'gpu0' is not a GPU index or UUID"),
    (["run", "--", "true"], {"CUDA_VISIBLE_DEVICES": "GPU-nope"}, "no GPU with UUID 'GPU-nope'"),
    (["run", "--", "true"], {"NPROC_PER_NODE": "eight"}, "NPROC_PER_NODE='eight'"),
    (["run", "--", "true"], {"RUNPOD_GPU_COUNT": "lots"}, "expect-gpus='lots'"),
    (["run", "--", "true"], {"PODGUARD_PROBE": "maybe"}, "PODGUARD_PROBE='maybe'"),
    (["run", "--", "true"], {"PODGUARD_PROBE_CMD": "/no/such/probe"}, "'/no/such/probe' not found"),
    (["run", "--", "true"], {"PODGUARD_DEV_DIR": "/no/such/dev"}, "PODGUARD_DEV_DIR='/no/such/dev'"),
    (["run", "--busy-timeout", "-1", "--", "true"], {}, "--busy-timeout=-1"),
    (["run", "--busy-timeout", "soon", "--", "true"], {}, "'soon'"),
    (["run", "--grace", "nan", "--", "true"], {}, "--grace=nan"),
    (["run", "--idle-memory-mib", "-5", "--", "true"], {}, "--idle-memory-mib=-5"),
    (["run", "--on-fewer-gpus", "shrug", "--", "true"], {}, "on-fewer-gpus='shrug'"),
    (["run", "--probe-timeout", "0", "--", "true"], {"PODGUARD_PROBE": "cuda"}, "--probe-timeout=0"),
    (["run", "--", "true"], {"PODGUARD_STATE_DIR": "/proc/no-state-here"}, "state dir '/proc/no-state-here'"),
    (["run", "--frobnicate", "--", "true"], {}, "No such option: --frobnicate"),
    (["run"], {}, "no command given"),
    (["train", "--mode", "warp", "--", "true"], {}, "--mode='warp'"),
    (["train", "--on-exit", "explode", "--", "true"], {}, "explode"),
    (["train", "--only-gpu", "two", "--", "true"], {}, "--only-gpu='two'"),
    (["train", "--mode", "per-gpu", "--prefix", "{gpuu}:", "--", "true"], {}, "unknown field {gpuu}"),
    (["train", "--prepare", "true", "--cache-key", "novalue", "--", "true"], {}, "--cache-key='novalue'"),
    (["train", "--cache-key", "a=b", "--", "true"], {}, "--cache-key only makes sense with --prepare"),
    (["train", "--prepare", "'unclosed", "--", "true"], {}, "--prepare="),
    (["train", "--", "true"], {"MASTER_PORT": "99999"}, "99999"),
    (["train", "--", "true"], {"NUM_NODES": "2", "NODE_RANK": "2"}, "NODE_RANK=2"),
    (["train", "--mode", "torchrun", "--", "true"], {"NUM_NODES": "2", "NODE_RANK": "1"}, "PRIMARY_ADDR"),
    (["train", "--cpu-workers", "0", "--", "true"], {}, "--cpu-workers=0"),
    (["train", "--job-file", "/no/such.toml"], {}, "--job-file='/no/such.toml'"),
    (["train", "--max-restarts", "-1", "--", "true"], {}, "--max-restarts=-1"),
    (["train", "--rdzv-backend", "etcd", "--", "true"], {}, "--rdzv-backend='etcd'"),
    (["health", "--probe", "sometimes"], {}, "PODGUARD_PROBE='sometimes'"),
    (["gpus", "--nproc-per-node", "0"], {}, "NPROC_PER_NODE=0"),
    (["sweep", "--gpus-per-run", "x", "--", "true"], {}, "'x'"),
]


@pytest.mark.parametrize(("args", "env", "needle"), BAD_INPUT, ids=[" ".join(a) + str(e) for a, e, _ in BAD_INPUT])
def test_bad_input_exits_64_with_one_line_and_kills_nothing(node, args, env, needle):
    holder = node.spawn_holder(0, 1024)
    proc = run_pg(node, args, env=env)
    assert proc.returncode == 64, (proc.returncode, proc.stderr)
    assert needle in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    error_lines = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert len(error_lines) == 1, proc.stderr
    assert holder.poll() is None, "bad input must not kill anything"
    assert os.path.exists(f"/proc/{holder.pid}")


def test_sweep_asking_for_more_gpus_than_the_node_has_is_69(node):
    proc = run_pg(node, ["sweep", "--gpus-per-run", "3", "--runs", "3", "--", "true"])
    assert proc.returncode == 69
    assert "3 runs × 3 GPUs = 9 > 8 GPUs on this node" in proc.stderr
