"""End to end: `podguard train` / `podguard run` as a user runs them (real processes, real signals).

GPU runs use the fake 8-GPU node (the real NVML binding against the fake library); CPU runs use a
node without a driver (LD_LIBRARY_PATH emptied), the situation of these CI machines.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from jobproc import PODGUARD, run_podguard, script


@pytest.fixture
def node(cli_node):
    return cli_node


def pg(node, args, *, env=None, timeout=90.0, cpu=False):
    return run_podguard(node, args, env=env, timeout=timeout, cpu=cpu)


def test_per_gpu_first_failure_stops_the_rest_and_its_code_comes_out(node, tmp_path):
    worker = script(
        tmp_path,
        "w.py",
        """
        import os, sys, time
        print("visible", os.environ["CUDA_VISIBLE_DEVICES"], "rank", os.environ["RANK"], flush=True)
        if os.environ["RANK"] == "5":
            print("boom on rank 5", flush=True)
            sys.exit(3)
        time.sleep(60)
        """,
    )
    started = time.monotonic()
    proc = pg(node, ["train", "--mode", "per-gpu", "--grace", "2", "--", sys.executable, worker])
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert time.monotonic() - started < 30
    out = proc.stdout + proc.stderr
    shown = [m.groups() for m in re.finditer(r"^GPU(\d+):visible GPU-\S+ rank (\d+)$", out, re.MULTILINE)]
    assert shown  # (fail-fast may stop some workers before they print)
    assert all(gpu == rank for gpu, rank in shown)  # the GPU{index}: prefix matches the worker's GPU
    assert "GPU5" in out and "boom on rank 5" in out  # the summary names the GPU and its last lines


def test_sigterm_to_podguard_reaches_the_job_and_exits_143_without_orphans(node, tmp_path):
    pids = tmp_path / "pids"
    worker = script(
        tmp_path,
        "w.py",
        f"""
        import os, signal, sys, time
        with open({str(pids)!r}, "a") as fh:
            fh.write(f"{{os.getpid()}}\\n")
        signal.signal(signal.SIGTERM, lambda *a: (print("got SIGTERM", flush=True), sys.exit(0)))
        time.sleep(60)
        """,
    )
    proc = subprocess.Popen(
        [*PODGUARD, "train", "--mode", "per-gpu", "--nproc-per-node", "4", "--", sys.executable, worker],
        env=node.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (not pids.exists() or len(pids.read_text().split()) < 4):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 143, out
    assert out.count("got SIGTERM") == 4
    for pid in pids.read_text().split():
        assert not os.path.exists(f"/proc/{pid}"), f"worker {pid} outlived podguard"


def test_two_concurrent_runs_get_disjoint_gpus_and_distinct_ports(node, tmp_path):
    gate = tmp_path / "release"
    worker = script(
        tmp_path,
        "w.py",
        f"""
        import os, time
        print("ENV", os.environ["CUDA_VISIBLE_DEVICES"], os.environ["MASTER_PORT"], flush=True)
        while not os.path.exists({str(gate)!r}):
            time.sleep(0.02)
        """,
    )
    args = ["train", "--mode", "per-gpu", "--nproc-per-node", "2", "--", sys.executable, worker]
    runs = [
        subprocess.Popen([*PODGUARD, *args], env=node.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(2)
    ]
    time.sleep(0)  # both start at once; the leases decide
    deadline = time.monotonic() + 40
    state = tmp_path / "state"
    while time.monotonic() < deadline:
        logs = list((state / "runs").glob("*/logs/*")) if (state / "runs").exists() else []
        if sum(1 for log in logs if log.is_file() and "ENV" in log.read_text()) >= 4:
            break
        time.sleep(0.05)
    gate.write_text("go")
    outs = [r.communicate(timeout=30)[0] for r in runs]
    assert [r.returncode for r in runs] == [0, 0], outs
    seen = [[line.split() for line in out.splitlines() if "ENV" in line] for out in outs]
    gpus = [{fields[1] for fields in run} for run in seen]
    ports = [{fields[2] for fields in run} for run in seen]
    assert all(len(g) == 2 for g in gpus) and not (gpus[0] & gpus[1])
    assert len(ports[0]) == 1 and len(ports[1]) == 1 and ports[0] != ports[1]


def test_torchrun_on_cpu_with_rank_1_failing_reports_its_real_code(node, tmp_path):
    worker = script(
        tmp_path,
        "train.py",
        """
        import os, sys
        if os.environ["RANK"] == "1":
            print("rank 1 fails", flush=True)
            sys.exit(7)
        print("rank 0 ok", flush=True)
        """,
    )
    proc = pg(node, ["train", "--mode", "torchrun", "--cpu-workers", "2", "--", sys.executable, worker], cpu=True)
    assert proc.returncode == 7, (proc.stdout + proc.stderr)[-3000:]
    assert "rank 1" in proc.stderr or "rank1" in proc.stderr


def test_prepare_runs_once_then_is_skipped_by_its_stamp(node, tmp_path):
    count = tmp_path / "count"
    prep = f"sh -c 'echo run >> {count}; echo data > \"$PODGUARD_PREPARE_DIR/x\"'"
    check = script(
        tmp_path,
        "check.py",
        """
        import os, pathlib
        print("prepared:", (pathlib.Path(os.environ["PODGUARD_PREPARE_DIR"]) / "x").read_text().strip())
        """,
    )
    args = ["train", "--mode", "single", "--prepare", prep, "--cache-key", "dataset=demo"]
    for _ in range(2):
        proc = pg(node, [*args, "--", sys.executable, check], cpu=True)
        assert proc.returncode == 0, proc.stderr
        assert "prepared: data" in proc.stdout + proc.stderr
    assert count.read_text().count("run") == 1


def test_only_gpu_shows_one_gpu_on_the_terminal_but_logs_keep_all(node, tmp_path):
    worker = script(tmp_path, "w.py", "import os; print('hello from', os.environ['RANK'])\n")
    proc = pg(node, ["train", "--mode", "per-gpu", "--only-gpu", "2", "--", sys.executable, worker])
    assert proc.returncode == 0, proc.stderr
    shown = [line for line in (proc.stdout + proc.stderr).splitlines() if "hello from" in line]
    assert shown == ["GPU2:hello from 2"]
    logs = sorted((tmp_path / "state" / "runs").glob("*/logs/*.log"))
    assert len(logs) == 8


def test_run_command_sees_exactly_the_selected_gpus_by_uuid(node, tmp_path):
    inventory = json.loads(pg(node, ["gpus", "--json"]).stdout)
    proc = pg(
        node,
        ["run", "--", "sh", "-c", "echo CVD=$CUDA_VISIBLE_DEVICES ORDER=$CUDA_DEVICE_ORDER"],
        env={"GPU_LIST": "6,1"},
    )
    assert proc.returncode == 0, proc.stderr
    uuids = [inventory["gpus"][6]["uuid"], inventory["gpus"][1]["uuid"]]
    assert f"CVD={','.join(uuids)} ORDER=PCI_BUS_ID" in proc.stdout + proc.stderr


def test_job_exit_code_and_signal_codes_pass_through(node):
    assert pg(node, ["run", "--", "sh", "-c", "exit 42"], cpu=True).returncode == 42
    assert pg(node, ["run", "--", "sh", "-c", "kill -KILL $$"], cpu=True).returncode == 137


@pytest.mark.slow
def test_demo_job_end_to_end_on_cpu(node, tmp_path):
    """The README's first command on a machine without a GPU: 2 gloo workers, a real model, a summary."""
    proc = pg(node, ["train"], cpu=True, timeout=180)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "NO GPU FOUND" in out
    assert "CPU0:" in out and "CPU1:" in out
    assert "DONE" in out and "samples/s" in out


def test_sweep_runs_disjoint_gpu_sets_concurrently(node):
    proc = pg(node, ["sweep", "--gpus-per-run", "4", "--", "sh", "-c", "echo CVD=$CUDA_VISIBLE_DEVICES"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = re.findall(r"^run(\d):.*CVD=(\S+)$", proc.stdout + proc.stderr, re.MULTILINE)
    sets = {run: set(cvd.split(",")) for run, cvd in found}
    assert sorted(sets) == ["0", "1"]
    assert len(sets["0"]) == 4 and len(sets["1"]) == 4 and not (sets["0"] & sets["1"])


def test_roles_job_file_starts_trainers_after_the_server_is_ready(node, tmp_path):
    server = script(
        tmp_path,
        "server.py",
        """
        import os, time
        print("server on", os.environ["CUDA_VISIBLE_DEVICES"], flush=True)
        print("Uvicorn running", flush=True)
        time.sleep(60)
        """,
    )
    trainer = script(
        tmp_path,
        "trainer.py",
        "import os; print('trainer rank', os.environ['RANK'], 'sees', os.environ['CUDA_VISIBLE_DEVICES'])\n",
    )
    job = tmp_path / "job.toml"
    job.write_text(
        textwrap.dedent(
            f"""
            [roles.server]
            command = [{sys.executable!r}, {server!r}]
            gpus = 1
            ready = {{ log = "Uvicorn running" }}

            [roles.trainer]
            command = [{sys.executable!r}, {trainer!r}]
            gpus = "rest"
            after = ["server"]
            per_gpu = true
            """
        )
    )
    proc = pg(node, ["train", "--job-file", str(job)])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    trainers = re.findall(r"trainer rank (\d+) sees (\S+)", out)
    assert len(trainers) == 7
    server_gpu = re.search(r"server on (\S+)", out).group(1)
    assert server_gpu not in {cvd for _, cvd in trainers}
    assert out.index("Uvicorn running") < out.index("trainer rank")
