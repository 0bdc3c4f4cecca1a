"""Billing guards end to end: real `podguard run` processes on the fake NVML node, inside a "pod" (RUNPOD_POD_ID and
the stand-in API) or outside one, and the laptop side (`[limits]`, `uptime`/`spent`).

RunPod's stop is what ends a pod's container: once the stop request reaches the stand-in, the tests send SIGTERM to
the podguard process, as RunPod would. PODGUARD_GUARD_INTERVAL makes the idle sampler fast.
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
from pathlib import Path

import pytest
from pods_support import A40_SPEC, KEY, PODGUARD, pg, standin, write_spec  # noqa: F401 (fixture)

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


# -- inside an Instant Cluster member -------------------------------------------------------------------------------

A40_X8_CLUSTER_PER_HR = 4 * A40_X8_PER_HR  # 4 nodes of 8x A40: $14.08/hr


@pytest.fixture
def cluster(standin, cli_node):  # noqa: F811
    """An Instant Cluster in the stand-in: 4 nodes of 8x A40 ($3.52/hr each, $14.08/hr in all), all RUNNING.
    Its member pods answer 409 to a stop, as RunPod's do."""
    world = standin.world
    world.set_capacity("NVIDIA A40", 64)
    body = {"name": "ring", "type": "TRAINING", "image": "img:1", "args": "run"}
    record = world.create_cluster({**body, "compute": {"gpuTypeId": "NVIDIA A40", "gpuCountPerPod": 8, "podCount": 4}})
    wait_for(lambda: all(p.status == "RUNNING" for p in world.members(record)), "every node to run")
    return record


def member(standin, cluster, rank: int):  # noqa: F811
    return next(p for p in standin.world.members(cluster) if p.rank == rank)


def delete_then_sigterm(standin, cluster, proc: subprocess.Popen[str]) -> tuple[str, str]:  # noqa: F811
    """Wait for the cluster's delete (a process that ends first, or never sees it, fails the test and is killed), then
    SIGTERM the process as RunPod's delete does; its output."""
    deletes = rf"^/v2/clusters/{cluster.id}$"
    try:
        wait_for(lambda: standin.calls("DELETE", deletes) or proc.poll() is not None, "the cluster delete", timeout=60)
        if proc.poll() is not None:
            pytest.fail(
                f"podguard ended without deleting the cluster (exit {proc.returncode}):\n{proc.communicate()[1]}"
            )
        wait_for(lambda: cluster.id not in standin.world.clusters, "the cluster to go")
        proc.send_signal(signal.SIGTERM)
        return proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def deleted_by_runpod(standin, cluster, proc: subprocess.Popen[str]) -> tuple[str, str]:  # noqa: F811
    """Wait for the cluster's delete, then end the container's process as RunPod does (it terminates every node)."""
    deletes = rf"^/v2/clusters/{cluster.id}$"
    wait_for(lambda: standin.calls("DELETE", deletes) or proc.poll() is not None, "the cluster delete")
    wait_for(lambda: cluster.id not in standin.world.clusters or proc.poll() is not None, "the cluster to go")
    if proc.poll() is not None:
        pytest.fail(f"podguard ended before RunPod ended it (exit {proc.returncode}):\n{proc.communicate()[1]}")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM, out + err
    return out, err


def test_a_guard_on_a_cluster_node_deletes_the_cluster(standin, cluster, cli_node, tmp_path):  # noqa: F811
    node2 = member(standin, cluster, 2)
    job, pids_file = tree_job(tmp_path)
    proc = start(cli_node, ["run", "--idle-stop", "1", "--grace", "1", "--", sys.executable, job], node2.id)
    pids = job_pids(pids_file)
    _, err = deleted_by_runpod(standin, cluster, proc)
    assert not any(alive(p) for p in pids), "the job's tree must be gone"
    said = [line for line in err.splitlines() if "billing guard --idle-stop" in line]
    assert len(said) == 1, err
    assert f"this pod ({node2.id}) is node2 of Instant Cluster {cluster.id}, whose pods cannot be stopped" in said[0]
    assert "deleting the whole cluster, all its nodes (network volumes stay; billing ends)" in said[0]
    assert standin.calls("POST", r"/action$") == []  # no stop asked of a member: RunPod would answer 409
    assert len(standin.calls("DELETE", rf"^/v2/clusters/{cluster.id}$")) == 1
    assert all(p.status == "TERMINATED" for p in standin.world.pods.values())


def test_max_cost_on_a_cluster_node_counts_every_nodes_spend(standin, cluster, cli_node, tmp_path):  # noqa: F811
    # every node has run for an hour less 8 s: the cluster has spent about $14.08 - 8 s of $14.08/hr, so a
    # $14.08 limit trips a few seconds in (one node alone would take three more hours to get there)
    for node in standin.world.members(cluster):
        standin.world.backdate(node.id, 3600 - 8.0)
    node1 = member(standin, cluster, 1)
    job, pids_file = tree_job(tmp_path)
    args = ["run", "--max-cost", f"{A40_X8_CLUSTER_PER_HR:.2f}", "--grace", "1", "--", sys.executable, job]
    started = time.monotonic()
    proc = start(cli_node, args, node1.id)
    pids = job_pids(pids_file)
    _, err = deleted_by_runpod(standin, cluster, proc)
    assert time.monotonic() - started < 30
    assert f"billing guards: --max-cost $14.08 (cluster {cluster.id} (4 nodes): about $14.0" in err
    assert f"billing guard --max-cost: cluster {cluster.id} (4 nodes) has spent about $14.08 in 1h" in err
    assert "since its first node's start at $14.08/hr (limit $14.08)" in err and not any(alive(p) for p in pids)
    assert len(standin.calls("GET", rf"^/v2/clusters/{cluster.id}/pods$")) == 1  # every member's cost, read once
    assert len(standin.calls("GET", rf"^/v2/pods/{node1.id}$")) == 2  # the budget, and the end


def test_a_cluster_that_spent_its_budget_is_deleted_before_anything_runs(standin, cluster, cli_node):  # noqa: F811
    for node in standin.world.members(cluster):
        standin.world.backdate(node.id, 3600)  # $3.52 per node, $14.08 in all: over $5 only when summed
    backdated = time.monotonic()
    proc = start(
        cli_node, ["run", "--max-cost", "5", "--", sys.executable, "-c", "print('ran')"], member(standin, cluster, 0).id
    )
    out, err = deleted_by_runpod(standin, cluster, proc)
    spent = float(re.search(r"has spent about \$(\d+\.\d\d)", err).group(1))  # the cluster's sum, as it read it
    drift = 14.08 * (time.monotonic() - backdated) / 3600  # the clock ran on while a busy machine started podguard
    assert 14.08 <= spent <= 14.08 + drift + 0.01, err
    assert "ran" not in out and "PASS" not in err


def test_a_lost_delete_answer_is_already_deleted(standin, cluster, cli_node):  # noqa: F811
    standin.fault("DELETE", r"^/v2/clusters/", "lost")  # deleted, answer lost: the retry finds it gone (404)
    args = ["run", "--max-runtime", "0.5", "--", sys.executable, "-c", "import time; time.sleep(60)"]
    proc = start(cli_node, args, member(standin, cluster, 3).id)
    _, err = deleted_by_runpod(standin, cluster, proc)
    said = "already deleted (by another node's guard, or this request's own retry after a lost answer): the whole"
    assert said in err
    assert len(standin.calls("DELETE", rf"^/v2/clusters/{cluster.id}$")) == 2


def test_a_refused_cluster_delete_is_124_saying_how_to_end_it(standin, cluster, cli_node):  # noqa: F811
    standin.fault("DELETE", r"^/v2/clusters/", "403")  # e.g. a key that may not delete clusters
    args = ["run", "--max-runtime", "0.5", "--", sys.executable, "-c", "import time; time.sleep(60)"]
    proc = start(cli_node, args, member(standin, cluster, 1).id)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 124, err
    assert f"warning: could not delete cluster {cluster.id}" in err and "HTTP 403" in err
    assert f"the cluster is still billing: exiting 124; delete it by hand: podguard pod down {cluster.id}" in err
    assert "Traceback" not in err and KEY not in out + err
    assert standin.calls("POST", r"/action$") == [] and cluster.id in standin.world.clusters


def test_on_exit_stop_pod_on_node_0_deletes_the_cluster_as_a_guard_does(standin, cluster, cli_node):  # noqa: F811
    """One way to end this pod's billing: `--on-exit stop-pod` on a cluster's node 0 ends the cluster's billing as a
    guard does (a member cannot be stopped: RunPod answers 409 and the cluster would bill on), then waits for
    RunPod's SIGTERM; the successful job's code wins."""
    node0 = member(standin, cluster, 0)
    args = ["train", "--on-exit", "stop-pod", "--mode", "single", "--", sys.executable, "-c", "pass"]
    proc = start(cli_node, args, node0.id)
    out, err = delete_then_sigterm(standin, cluster, proc)  # RunPod's delete ends the container
    deletes = rf"^/v2/clusters/{cluster.id}$"
    assert proc.returncode == 0, out + err  # the successful job's code
    said = [line for line in err.splitlines() if "job succeeded" in line]
    assert len(said) == 1, err
    assert f"this pod ({node0.id}) is node0 of Instant Cluster {cluster.id}, whose pods cannot be stopped" in said[0]
    assert "deleting the whole cluster, all its nodes (network volumes stay; billing ends)" in said[0]
    assert "(--on-exit stop-pod)" in said[0]
    assert standin.calls("POST", r"/action$") == []  # no stop asked of a member
    assert len(standin.calls("DELETE", deletes)) == 1
    assert all(p.status == "TERMINATED" for p in standin.world.pods.values())


def test_on_exit_stop_pod_on_another_node_leaves_the_delete_to_node_0(standin, cluster, cli_node):  # noqa: F811
    """A node that finishes first must not cut the others' last steps (node 0 commits a multi-node checkpoint to the
    store only once every node's files are in): node 1 asks nothing and waits; node 0's delete ends it."""
    node1 = member(standin, cluster, 1)
    args = ["train", "--on-exit", "stop-pod", "--mode", "single", "--", sys.executable, "-c", "pass"]
    proc = start(cli_node, args, node1.id)
    try:
        wait_for(lambda: "waiting for it" in (proc.stderr.readline() if proc.stderr else ""), "node 1's line")
        assert standin.calls("DELETE", rf"^/v2/clusters/{cluster.id}$") == [] and cluster.id in standin.world.clusters
        assert standin.calls("POST", r"/action$") == []
        assert proc.poll() is None  # it waits for node 0's delete (RunPod's SIGTERM)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0
    assert cluster.id in standin.world.clusters  # node 1 never deleted it


def test_park_stop_on_a_cluster_node_deletes_the_cluster(standin, cluster, cli_node):  # noqa: F811
    """Self-heal's PODGUARD_PARK=stop ends the billing the same one way: a member's restart is refused (409), the
    node parks, and the park deletes the cluster instead of asking a member stop that RunPod refuses too."""
    cli_node.write(sc.retired_pages(gpu=3))  # the preflight fails (76)
    node1 = member(standin, cluster, 1)
    env = {"PODGUARD_SELF_HEAL": "restart", "PODGUARD_SELF_HEAL_AFTER": "1", "PODGUARD_PARK": "stop"}
    proc = start(cli_node, ["train", "--mode", "single", "--", sys.executable, "-c", "pass"], node1.id, **env)
    out, err = delete_then_sigterm(standin, cluster, proc)  # a parked container waits for a signal
    deletes = rf"^/v2/clusters/{cluster.id}$"
    assert proc.returncode == 128 + signal.SIGTERM, out + err
    assert "restart failed" in err and "PARKED" in err, err
    said = [line for line in err.splitlines() if "(PODGUARD_PARK=stop)" in line]
    assert len(said) == 1 and f"is node1 of Instant Cluster {cluster.id}, whose pods cannot be stopped" in said[0], err
    assert [json.loads(c.body)["action"] for c in standin.calls("POST", r"/action$")] == ["restart"]  # (refused)
    assert len(standin.calls("DELETE", deletes)) == 1


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
    assert "billing guards" not in proc.stderr  # no guard is left on: no (empty) "billing guards:" line
    assert "podguard: \n" not in proc.stderr + "\n" and not proc.stderr.rstrip("\n").endswith("podguard:")


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
    assert env.pop("PODGUARD_MARK").startswith("podguard/1 name=")  # podguard's mark on what it makes
    assert env == {
        "WANDB_PROJECT": "demo",
        "PODGUARD_IDLE_STOP": "30m",
        "PODGUARD_MAX_RUNTIME": "86400",
        "PODGUARD_MAX_COST": "150",
    }


def test_hang_timeout_and_restarts_in_limits_reach_the_pod_as_their_variables(standin, tmp_path):  # noqa: F811
    spec = write_spec(tmp_path / "pod.toml", A40_SPEC + '\n[limits]\nhang_timeout = "30m"\nrestarts = 2\n')
    proc = pg(["pod", "up", "--spec", str(spec), "--json"])
    assert proc.returncode == 0, proc.stderr
    (create,) = standin.calls("POST", r"^/v2/pods$")
    env = json.loads(create.body)["env"]
    assert env.pop("PODGUARD_MARK").startswith("podguard/1 name=")
    assert env == {"WANDB_PROJECT": "demo", "PODGUARD_HANG_TIMEOUT": "30m", "PODGUARD_RESTARTS": "2"}


CLUSTER_SPEC = """
    name = "ring"
    image = "registry.example/me/podguard:0.2"
    args = "train --mode torchrun -- python train.py"

    [gpu]
    types = ["NVIDIA A40"]
    count = 2

    [cluster]
    nodes = 3
"""


@pytest.mark.parametrize(
    ("extra", "noted"),
    [
        (LIMITS, True),
        ('\n[limits]\nidle_stop = "off"\nmax_cost_usd = 0\n', False),
        ('\n[env]\nPODGUARD_MAX_RUNTIME = "2h"\n', True),
        ('\n[limits]\nhang_timeout = "1h"\n', False),  # the run's watch is no billing guard (restarts: 64)
        ("", False),
    ],
    ids=["limits", "limits-off", "env", "watch-only", "none"],
)
def test_pod_up_of_a_cluster_with_limits_says_once_that_a_guard_deletes_it(standin, tmp_path, extra, noted):  # noqa: F811
    spec = write_spec(tmp_path / "cluster.toml", CLUSTER_SPEC + extra)
    proc = pg(["pod", "up", "--spec", str(spec), "--json", "--no-wait"])
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["nodes"] == 3
    note = (
        "podguard: note: [limits] on a cluster: a billing guard that fires on any node deletes cluster ring (all 3 "
        "nodes; member pods cannot be stopped and a cluster has no stop; network volumes stay), and --max-cost "
        "counts every node's spend"
    )
    assert proc.stderr.count(note) == (1 if noted else 0), proc.stderr
    assert proc.stderr.count("[limits] on a cluster") == (1 if noted else 0)
    if noted:  # up front: before the cluster is created
        assert proc.stderr.index(note) < proc.stderr.index("created cluster ring")


@pytest.mark.parametrize(
    ("limits", "named"),
    [
        ('idle_stop = "soon"', "[limits] idle_stop = 'soon' is not valid; expected e.g. 90s, 30m"),
        ("max_cost_usd = -1", "[limits] max_cost_usd = -1 is not valid; expected US dollars"),
        ("max_runtime = true", "[limits] max_runtime = True is not valid"),
        ('stop_after = "1h"', "[limits] stop_after is not a known key"),
        ('hang_timeout = "forever"', "[limits] hang_timeout = 'forever' is not valid; expected e.g. 90s"),
        ("restarts = -1", "[limits] restarts = -1 is not valid; expected a whole number of relaunches"),
        ("restarts = 1.5", "[limits] restarts = 1.5 is not valid"),
        ('restarts = "many"', "[limits] restarts = 'many' is not valid"),
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
