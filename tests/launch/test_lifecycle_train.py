"""The train flow's lifecycle end to end: real `podguard train` runs as a container's entry process (PID 1 of
fresh namespaces, see containersim.py) on the fake 8-GPU node: restarts, full volumes, new pods, ports."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from containersim import in_container, require_namespaces
from fakenvml.scenario import remap_failure

PODGUARD = [sys.executable, "-m", "podguard"]


@pytest.fixture
def node(cli_node):
    return cli_node


@pytest.fixture
def state() -> Path:
    path = Path(os.environ["PODGUARD_STATE_DIR"])  # set by cli_node
    path.mkdir(parents=True, exist_ok=True)
    return path


def _script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def _run(argv: list[str], node, env: dict[str, str] | None = None, timeout: float = 120.0):
    return subprocess.run(
        argv, env={**node.env, **(env or {})}, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


def _container_start(node, args: list[str], *, pod: str | None = None, **kwargs):
    """One start of the container: podguard as its PID 1 (a restart is simply the next call)."""
    env = {"RUNPOD_POD_ID": pod} if pod is not None else {}
    return _run(in_container([*PODGUARD, *args], **kwargs), node, env)


def _histories(state: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((state / "jobs").glob("*.json"))]


# --------------------------------------------------------------------------------------------------
# item 8: a full /workspace


FILL = """
import os, sys
try:  # the job's checkpoints fill the volume
    with open(os.path.join(os.environ["PODGUARD_STATE_DIR"], "checkpoint"), "wb") as fh:
        while True:
            fh.write(b"x" * 65536)
except OSError as exc:
    print("volume full:", exc.strerror, flush=True)
sys.exit(int(sys.argv[1]))
"""


@pytest.mark.parametrize("code", [0, 3])
def test_a_full_workspace_does_not_turn_the_jobs_exit_into_a_crash(node, state, tmp_path, code):
    require_namespaces()
    job = _script(tmp_path, "fill.py", FILL)
    args = ["train", "--mode", "single", "--", sys.executable, job, str(code)]
    proc = _container_start(node, args, tmpfs=state, tmpfs_size="2m")
    assert proc.returncode == code, proc.stderr[-3000:]
    assert "volume full: No space left on device" in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "could not record how this run ended" in line]
    assert len(warnings) == 1, proc.stderr[-3000:]


# --------------------------------------------------------------------------------------------------
# item 9: "already finished" is per pod


def test_a_finished_job_is_skipped_when_its_pod_restarts_but_runs_on_a_new_pod(node, state, tmp_path):
    require_namespaces()
    count = tmp_path / "count"
    job = _script(tmp_path, "job.py", f"open({str(count)!r}, 'a').write('ran\\n')\n")
    args = ["train", "--mode", "single", "--", sys.executable, job]

    def runs() -> int:
        return len(count.read_text().split()) if count.exists() else 0

    first = _container_start(node, args, pod="pod-a")
    assert first.returncode == 0 and runs() == 1, first.stderr[-3000:]
    restart = _container_start(node, args, pod="pod-a")  # RunPod restarted the container
    assert restart.returncode == 0 and runs() == 1, restart.stderr[-3000:]
    assert "already finished successfully" in restart.stderr
    new_pod = _container_start(node, args, pod="pod-b")  # another pod mounts the same volume
    assert new_pod.returncode == 0 and runs() == 2, new_pod.stderr[-3000:]
    assert "already finished" not in new_pod.stderr
    again = _container_start(node, args, pod="pod-b")
    assert again.returncode == 0 and runs() == 2 and "already finished successfully" in again.stderr
    assert sorted(h["pod"] for h in _histories(state)) == ["pod-a", "pod-b"]


# --------------------------------------------------------------------------------------------------
# item 10: the crash-loop guard counts preflight failures


def _lines(stream, into: queue.Queue[str]) -> None:
    for line in stream:
        into.put(line)
    into.put("")


def _child_of(pid: int) -> int:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            children = []
        if children:
            return int(children[0])
        time.sleep(0.01)
    raise AssertionError(f"pid {pid} started no child")


def _sigterm_during_the_backoff(node, args: list[str]) -> tuple[int, str]:
    """Start the container once more, wait for the announced 10 s pause, `docker stop` it (SIGTERM to
    podguard, its PID 1); its exit code and everything it printed."""
    third = subprocess.Popen(
        in_container([*PODGUARD, *args]), env=node.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_lines, args=(third.stderr, lines), daemon=True).start()
    seen = ""
    try:
        deadline = time.monotonic() + 60
        while "waiting 10 s before launching again" not in seen:
            seen += lines.get(timeout=max(0.1, deadline - time.monotonic()))
            assert time.monotonic() < deadline and third.poll() is None, seen
        os.kill(_child_of(third.pid), signal.SIGTERM)
        code = third.wait(timeout=30)
    finally:
        third.kill()
        third.wait()
    while (line := lines.get(timeout=10)) != "":
        seen += line
    return code, seen


def test_a_broken_gpu_restart_loop_backs_off_instead_of_spinning(node, state, tmp_path):
    require_namespaces()
    node.write(remap_failure())
    args = ["train", "--mode", "single", "--", "true"]
    for _ in range(2):
        proc = _container_start(node, args)
        assert proc.returncode == 76, proc.stderr[-3000:]
    [record] = _histories(state)
    assert [(r["kind"], r["exit_code"], r["root_cause"]) for r in record["history"]] == [("start", 76, "preflight")] * 2
    assert "failed the health check" in record["history"][-1]["detail"]

    code, seen = _sigterm_during_the_backoff(node, args)
    assert code == 128 + signal.SIGTERM
    assert "crashed within 60 s of starting 2 times in a row (last: exit 76)" in seen
    assert "not launching" in seen and "UNHEALTHY" not in seen  # no preflight ran during the pause


# --------------------------------------------------------------------------------------------------
# item 13 (launch side): the job's argv in records, leases and podguard's own lines


def test_secrets_in_the_jobs_argv_stay_out_of_records_and_leases(node, state, tmp_path):
    token = "hf_" + "Z9y8" * 8
    job = _script(
        tmp_path,
        "job.py",
        """
        import os, sys
        for root, _, files in os.walk(os.path.join(os.environ["PODGUARD_STATE_DIR"], "leases")):
            for name in files:
                text = open(os.path.join(root, name), errors="replace").read()
                if text.strip():
                    print("LEASE", text.strip(), flush=True)
        sys.exit(4)
        """,
    )
    proc = _run([*PODGUARD, "train", "--mode", "single", "--", sys.executable, job, "--hf_token", token], node)
    assert proc.returncode == 4, proc.stderr[-3000:]
    assert "LEASE" in proc.stdout and "--hf_token '***'" in proc.stdout
    assert token not in proc.stdout + proc.stderr
    [path] = sorted((state / "jobs").glob("*.json"))
    assert token not in path.read_text() and "***" in path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


# --------------------------------------------------------------------------------------------------
# Every run gets its port; GPU_LIST=-1 is loud


def test_sweep_runs_in_single_mode_each_get_their_own_master_port(node, tmp_path):
    """Seed 003: `sweep -- sh train.sh` runs whose scripts spawn their own ranks all used 29500."""
    meet = tmp_path / "meet"
    meet.mkdir()
    train = _script(  # prints its rendezvous, then stays until all four runs are up (they overlap)
        tmp_path,
        "train.sh",
        f"""
        echo "PORT=$MASTER_PORT ADDR=$MASTER_ADDR GPUS=$CUDA_VISIBLE_DEVICES"
        touch {meet}/$$; i=0
        while [ $(ls {meet} | wc -l) -lt 4 ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done
        """,
    )
    proc = _run([*PODGUARD, "sweep", "--gpus-per-run", "2", "--", "sh", train], node)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = re.findall(r"PORT=(\d*) ADDR=(\S*) GPUS=", proc.stdout)
    assert len(found) == 4, proc.stdout
    assert all(port and addr == "127.0.0.1" for port, addr in found), found
    assert len({port for port, _ in found}) == 4, found


def test_the_users_own_master_port_and_addr_are_left_alone(node, tmp_path):
    show = _script(tmp_path, "show.sh", 'echo "PORT=$MASTER_PORT ADDR=$MASTER_ADDR"\n')
    proc = _run([*PODGUARD, "run", "--", "sh", show], node, {"MASTER_PORT": "12345", "MASTER_ADDR": "10.0.0.7"})
    assert proc.returncode == 0 and "PORT=12345 ADDR=10.0.0.7" in proc.stdout, proc.stderr[-3000:]
    proc = _run([*PODGUARD, "run", "--", "sh", show], node)
    assert proc.returncode == 0 and re.search(r"PORT=\d+ ADDR=127\.0\.0\.1", proc.stdout), proc.stdout


def test_gpu_list_minus_one_on_a_node_with_gpus_is_a_warning_in_train(node):
    proc = _run([*PODGUARD, "train", "--mode", "single", "--", "true"], node, {"GPU_LIST": "-1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    warnings = [line for line in proc.stderr.splitlines() if line.lstrip().startswith("!")]
    assert any("GPU_LIST" in line for line in warnings), proc.stderr


def test_a_refused_configuration_in_a_restart_loop_is_counted_and_backs_off(node, state):
    """A start command with a bad option fails at once on every restart: it counts as a quick crash too."""
    require_namespaces()
    args = ["train", "--prepare", "'unclosed", "--", "true"]
    for _ in range(2):
        proc = _container_start(node, args)
        assert proc.returncode == 64 and "--prepare=" in proc.stderr, proc.stderr[-2000:]
    [record] = _histories(state)
    assert [(r["kind"], r["exit_code"], r["root_cause"]) for r in record["history"]] == [
        ("start", 64, "configuration")
    ] * 2
    code, _ = _sigterm_during_the_backoff(node, args)
    assert code == 64  # the pause ends; the error is still the answer


def test_a_bad_option_typed_by_a_person_fails_at_once(node, state):
    for _ in range(3):
        started = time.monotonic()
        proc = _run([*PODGUARD, "train", "--prepare", "'unclosed", "--", "true"], node)
        assert proc.returncode == 64 and time.monotonic() - started < 30
        assert "waiting" not in proc.stderr
