"""Billing guards end to end: real `podguard run` processes on the fake NVML node, inside a "pod" (RUNPOD_POD_ID and
the stand-in API) or outside one, and the laptop side (`[limits]`, `uptime`/`spent`).

RunPod's stop is what ends a pod's container: once the stop request reaches the stand-in, the tests send SIGTERM to
the podguard process, as RunPod would. PODGUARD_GUARD_INTERVAL makes the idle sampler fast.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from pods_support import A40_SPEC, PODGUARD, pg, standin, write_spec  # noqa: F401 (fixture)

from fakenvml import scenario as sc

FAST_GUARDS = {"PODGUARD_GUARD_INTERVAL": "0.05", "PODGUARD_SELF_HEAL_RESTART_WAIT_S": "60"}
A40_X8_PER_HR = 0.44 * 8


@pytest.fixture
def pod(standin, cli_node):  # noqa: F811
    """This container's pod in the stand-in, RUNNING: 8x A40 at $3.52/hr."""
    record = standin.world.create(
        {
            "name": "trainer",
            "image": "img:1",
            "args": "run",
            "ports": ["22/tcp"],
            "gpu": {"id": "NVIDIA A40", "count": 8},
        }
    )
    wait_for(lambda: record.status == "RUNNING", "the pod to run")
    return record


def wait_for(cond, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def tree_job(tmp_path: Path) -> tuple[str, Path]:
    """A job with a child that ignores SIGTERM (only SIGKILL ends it); both write their pids, then wait."""
    pids = tmp_path / "pids"
    path = tmp_path / "job.py"
    path.write_text(
        textwrap.dedent(
            f"""
            import os, signal, subprocess, sys, time
            child = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                                      "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"])
            with open({str(pids)!r}, "w") as fh:
                fh.write(f"{{os.getpid()}} {{child.pid}}\\n")
            print("job running", flush=True)
            time.sleep(120)
            """
        )
    )
    return str(path), pids


def job_pids(pids: Path) -> list[int]:
    wait_for(lambda: pids.exists() and pids.read_text().endswith("\n"), "the job to start")
    return [int(p) for p in pids.read_text().split()]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def actions(standin, pod_id: str) -> list[str]:  # noqa: F811
    return [json.loads(c.body)["action"] for c in standin.calls("POST", rf"^/v2/pods/{pod_id}/action$")]


def start(node, args: list[str], pod_id: str | None, **env: str) -> subprocess.Popen[str]:
    full = {**node.env, **FAST_GUARDS, **env}
    if pod_id is None:
        full.pop("RUNPOD_POD_ID", None)
    else:
        full["RUNPOD_POD_ID"] = pod_id
    return subprocess.Popen(
        [*PODGUARD, *args],
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )


def stopped_by_runpod(standin, pod, proc: subprocess.Popen[str]) -> tuple[str, str]:  # noqa: F811
    """Wait for this pod's stop request, then end the container's process as RunPod does; podguard's output."""
    wait_for(lambda: "stop" in actions(standin, pod.id) or proc.poll() is not None, "the stop request")
    assert proc.poll() is None, proc.communicate()[1]
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM, out + err
    return out, err


# -- inside a pod ---------------------------------------------------------------------------------------------------


def test_idle_gpus_inside_a_pod_end_the_job_then_stop_this_pod(standin, pod, cli_node, tmp_path):  # noqa: F811
    job, pids_file = tree_job(tmp_path)
    proc = start(cli_node, ["run", "--idle-stop", "1", "--grace", "1", "--", sys.executable, job], pod.id)
    pids = job_pids(pids_file)
    wait_for(lambda: "stop" in actions(standin, pod.id) or proc.poll() is not None, "the stop request")
    assert not any(alive(p) for p in pids), "the job's tree must be gone before the pod is stopped"
    _, err = stopped_by_runpod(standin, pod, proc)
    assert "billing guard --idle-stop: every GPU at or below 5 % utilisation for 1" in err
    assert "limit 1s" in err and "GPU0 0%" in err and f"stopping pod {pod.id}" in err
    assert actions(standin, pod.id) == ["stop"] and pod.status == "EXITED"


@pytest.mark.parametrize("busy", [range(8), [5]], ids=["all-busy", "one-busy"])
def test_busy_gpus_never_fire_the_idle_guard(standin, pod, cli_node, busy):  # noqa: F811
    scenario = sc.healthy_h100()
    for i in busy:
        scenario.gpus[i].util_gpu = 87
    cli_node.write(scenario)
    args = ["run", "--idle-stop", "0.3", "--", sys.executable, "-c", "import time; time.sleep(2)"]
    proc = start(cli_node, args, pod.id)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "billing guard " not in out + err  # ("billing guards: --idle-stop 0.3s" names the guard that is on)
    assert actions(standin, pod.id) == [] and pod.status == "RUNNING"


def test_max_cost_counts_from_the_pods_start_and_stops_it(standin, pod, cli_node, tmp_path):  # noqa: F811
    # the pod has been up for an hour less 8 s (a container restart does not move startedAt): $3.52 is spent
    # a few seconds into this run, not an hour from now
    standin.world.backdate(pod.id, 3600 - 8.0)
    job, pids_file = tree_job(tmp_path)
    args = ["run", "--max-cost", f"{A40_X8_PER_HR:.2f}", "--grace", "1", "--", sys.executable, job]
    started = time.monotonic()
    proc = start(cli_node, args, pod.id)
    pids = job_pids(pids_file)
    _, err = stopped_by_runpod(standin, pod, proc)
    assert time.monotonic() - started < 30
    assert "billing guard --max-cost: pod" in err and "at $3.52/hr (limit $3.52)" in err
    assert not any(alive(p) for p in pids)
    assert actions(standin, pod.id) == ["stop"]
    reads = standin.calls("GET", rf"^/v2/pods/{pod.id}$")
    assert len(reads) == 2  # the cost/hr and start read once; the stop looks the pod up once


def test_max_cost_already_spent_stops_the_pod_before_anything_runs(standin, pod, cli_node):  # noqa: F811
    standin.world.backdate(pod.id, 2 * 3600)
    proc = start(cli_node, ["run", "--max-cost", "5", "--", sys.executable, "-c", "print('ran')"], pod.id)
    out, err = stopped_by_runpod(standin, pod, proc)
    assert "has spent about $7.04" in err and "ran" not in out
    assert "PASS" not in err  # no preflight either


def test_on_exit_idle_with_idle_stop_stops_the_pod_after_the_job(standin, pod, cli_node):  # noqa: F811
    args = ["run", "--on-exit", "idle", "--idle-stop", "0.5", "--", sys.executable, "-c", "print('done')"]
    proc = start(cli_node, args, pod.id)
    _, err = stopped_by_runpod(standin, pod, proc)
    ended = err.index("job ended with exit code 0")
    assert "--idle-stop 0.5s" in err[ended:]  # the idle line names the guards that stay on
    assert err.index("billing guard --idle-stop") > ended and "after the job" in err
    assert actions(standin, pod.id) == ["stop"]


# -- outside a pod --------------------------------------------------------------------------------------------------


def test_max_runtime_outside_a_pod_is_124_with_the_whole_tree_gone(cli_node, tmp_path):
    job, pids_file = tree_job(tmp_path)
    proc = start(cli_node, ["run", "--max-runtime", "1", "--grace", "0.5", "--", sys.executable, job], None)
    pids = job_pids(pids_file)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 124, err
    assert "billing guard --max-runtime: the job has run 1" in err and "(limit 1s)" in err
    assert "SIGKILL" in out  # the child ignored SIGTERM: the grace ran out
    assert "not inside a RunPod pod with an API key: exiting 124" in err
    assert not any(alive(p) for p in pids)


def test_idle_stop_ends_every_per_gpu_worker_outside_a_pod(cli_node, tmp_path):
    pids = tmp_path / "pids"
    worker = tmp_path / "w.py"
    worker.write_text(f"import os, time\nopen({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n')\ntime.sleep(120)\n")
    args = ["train", "--mode", "per-gpu", "--idle-stop", "2", "--grace", "1", "--", sys.executable, str(worker)]
    proc = start(cli_node, args, None)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 124, err
    assert "billing guard --idle-stop" in out and "stopping 8 worker(s)" in out
    started = [int(p) for p in pids.read_text().split()]
    assert len(started) == 8 and not any(alive(p) for p in started)


def test_cpu_only_run_ignores_idle_stop_with_one_warning(cli_node):
    env = {**cli_node.env, **FAST_GUARDS, "LD_LIBRARY_PATH": ""}
    proc = subprocess.run(
        [*PODGUARD, "run", "--idle-stop", "0.2", "--", sys.executable, "-c", "import time; time.sleep(1)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("--idle-stop is ignored: this run has no GPU to watch (CPU only)") == 1


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--idle-stop", "5x"], {}, "--idle-stop='5x'"),
        (["--max-runtime", "-1h"], {}, "--max-runtime='-1h'"),
        (["--max-cost", "lots"], {}, "--max-cost='lots'"),
        ([], {"PODGUARD_IDLE_STOP": "soon"}, "--idle-stop='soon'"),
        ([], {"PODGUARD_MAX_COST": "-3"}, "--max-cost='-3'"),
        (["--max-cost", "5"], {}, "--max-cost needs RUNPOD_POD_ID"),
        (["--idle-stop", "1"], {"PODGUARD_GUARD_INTERVAL": "0"}, "PODGUARD_GUARD_INTERVAL='0'"),
    ],
)
def test_bad_guard_values_are_64_before_anything_runs(cli_node, tmp_path, args, env, named):
    full = {k: v for k, v in cli_node.env.items() if k != "RUNPOD_POD_ID"}
    proc = subprocess.run(
        [*PODGUARD, "run", *args, "--", sys.executable, "-c", "print('ran')"],
        env={**full, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 64, proc.stderr
    assert named in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "ran" not in proc.stdout and not (tmp_path / "state" / "reports").exists()
    if "needs" not in named:
        assert "expected" in proc.stderr  # ... and what is valid


# -- from the laptop ------------------------------------------------------------------------------------------------

LIMITS = """
    [limits]
    idle_stop = "30m"
    max_runtime = 86400
    max_cost_usd = 150
"""


def test_limits_reach_the_create_body_as_guard_variables(standin, tmp_path):  # noqa: F811
    spec = write_spec(tmp_path / "pod.toml", A40_SPEC + LIMITS)
    proc = pg(["pod", "up", "--spec", str(spec), "--json"])
    assert proc.returncode == 0, proc.stderr
    (create,) = standin.calls("POST", r"^/v2/pods$")
    env = json.loads(create.body)["env"]
    assert env == {
        "WANDB_PROJECT": "demo",
        "PODGUARD_IDLE_STOP": "30m",
        "PODGUARD_MAX_RUNTIME": "86400",
        "PODGUARD_MAX_COST": "150",
    }


@pytest.mark.parametrize(
    ("limits", "named"),
    [
        ('idle_stop = "soon"', "[limits] idle_stop = 'soon' is not valid; expected e.g. 90s, 30m"),
        ("max_cost_usd = -1", "[limits] max_cost_usd = -1 is not valid; expected US dollars"),
        ("max_runtime = true", "[limits] max_runtime = True is not valid"),
        ('stop_after = "1h"', "[limits] stop_after is not a known key"),
    ],
)
def test_bad_limits_are_64_with_no_request(standin, tmp_path, limits, named):  # noqa: F811
    spec = write_spec(tmp_path / "pod.toml", A40_SPEC + f"\n[limits]\n{limits}\n")
    proc = pg(["pod", "up", "--spec", str(spec)])
    assert proc.returncode == 64 and named in proc.stderr, proc.stderr
    assert standin.requests == []


def test_status_and_list_show_uptime_and_spent(standin, tmp_path):  # noqa: F811
    spec = write_spec(tmp_path / "pod.toml", A40_SPEC)
    assert pg(["pod", "up", "--spec", str(spec)]).returncode == 0
    (pod,) = standin.world.pods.values()
    standin.world.backdate(pod.id, 1800)  # 30 minutes at 2x A40 ($0.88/hr): about $0.44
    status = json.loads(pg(["pod", "status", "trainer", "--json"]).stdout)
    assert 1800 <= status["uptime_s"] < 1800 + 60
    assert status["spent_usd"] == pytest.approx(0.88 * status["uptime_s"] / 3600, abs=1e-3)
    (listed,) = json.loads(pg(["pod", "list", "--json"]).stdout)
    assert listed["spent_usd"] == pytest.approx(0.44, abs=0.02)
    table = pg(["pod", "list"]).stdout
    assert "UPTIME" in table and "SPENT" in table and " 30m" in table and "$0.44" in table
    details = pg(["pod", "status", "trainer"]).stdout
    assert "uptime:   30m" in details and "spent:    $0.44 (since its start, an estimate)" in details
    assert pg(["pod", "stop", "trainer"]).returncode == 0
    stopped = json.loads(pg(["pod", "status", "trainer", "--json"]).stdout)
    assert stopped["uptime_s"] is None and stopped["spent_usd"] is None  # not running: nothing accrues


def test_guard_help_names_the_variables():
    proc = subprocess.run([*PODGUARD, "train", "--help"], capture_output=True, text=True, timeout=60, env=os.environ)
    assert proc.returncode == 0
    for var in ("PODGUARD_IDLE_STOP", "PODGUARD_MAX_RUNTIME", "PODGUARD_MAX_COST"):
        assert var in proc.stdout
