"""The image's entrypoint on a real engine: tini as PID 1, command dispatch, signals, reaping, bad input.

The image is built once per session (tests/image/conftest.py). `podguard image smoke` (test_image_cli.py)
covers --version, doctor --json, the demo job and `docker stop` as users run them.
"""

from __future__ import annotations

import time

import pytest
from imagetools import docker, logs, proc_table, wait_for_log

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def test_doctor_sees_tini_as_pid1_and_no_gpu(any_image: str) -> None:
    doctor = docker("run", "--rm", any_image, "doctor")
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    out = doctor.stdout + doctor.stderr
    assert "CPU only" in out, out
    assert "PID 1 tini" in out, out


def test_no_arguments_runs_the_default_command(any_image: str) -> None:
    proc = docker("run", "--rm", "-e", "PODGUARD_DEFAULT_CMD=podguard --version", any_image)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("podguard "), proc.stdout


def test_stop_forwards_sigterm_and_reaps(any_container) -> None:
    # The worker leaves an orphan (a backgrounded sleep whose shell exited): it is reparented to podguard,
    # the subreaper, which must reap it when it exits. No zombie may be left in the container.
    worker = "import os, time; os.system('sleep 0.3 &'); print('WORKER UP', flush=True); time.sleep(600)"
    cid = any_container("train", "--", "python", "-c", worker)
    wait_for_log(cid, "WORKER UP")

    deadline = time.monotonic() + 20
    while True:
        states = proc_table(cid)
        orphan = [s for s in states if s[1] == "sleep"]
        zombies = [s for s in states if s[2] == "Z"]
        if not orphan and not zombies:
            break
        assert time.monotonic() < deadline, f"orphan not reaped (zombies: {zombies}): {states}"
        time.sleep(0.2)
    assert any(pid == 1 and comm == "tini" for pid, comm, _, _ in states), states
    assert any(comm.startswith("python") for _, comm, _, _ in states), states  # the worker is still running

    start = time.monotonic()
    stop = docker("stop", "-t", "10", cid, timeout=60)
    took = time.monotonic() - start
    assert stop.returncode == 0, stop.stderr
    assert took < 6, f"docker stop took {took:.1f} s: SIGTERM was not forwarded (SIGKILL after 10 s)"
    exit_code = docker("inspect", "-f", "{{.State.ExitCode}}", cid).stdout.strip()
    out = logs(cid)
    assert exit_code == "143", f"exit {exit_code}\n{out[-3000:]}"
    assert "SIGTERM" in out, out[-3000:]


# -- the rest: RunPod start commands, bad input, PID 1 reaping outside podguard ------------------------


def test_runpod_style_start_command(any_image: str) -> None:
    proc = docker("run", "--rm", any_image, "bash", "-c", "podguard run -- echo hello")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "hello" in proc.stdout.splitlines(), proc.stdout


def test_other_commands_run_as_is(image: str) -> None:
    proc = docker("run", "--rm", image, "python", "-c", "import os, sys; print(os.getcwd(), sys.version_info[:2])")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().startswith("/workspace (3, "), proc.stdout


def test_bad_input_exits_64_with_one_line(any_image: str) -> None:
    proc = docker("run", "--rm", any_image, "train", "--mode", "warp", "--", "true")
    assert proc.returncode == 64, proc.stdout + proc.stderr
    err_lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert len(err_lines) == 1, err_lines
    assert "warp" in err_lines[0], err_lines


def test_pid1_reaps_orphans_of_a_plain_command(container) -> None:
    # Without an init, an orphan's zombie would stay forever (PID 1 here would be `sleep`, which never
    # waits). tini reaps it. The shell backgrounds `sleep 0.3` and exits; bash then exec's the long sleep.
    cid = container("bash", "-c", "sh -c 'sleep 0.3 &'; echo WORKER UP; exec sleep 600")
    wait_for_log(cid, "WORKER UP")
    deadline = time.monotonic() + 20
    while True:
        states = proc_table(cid)
        leftovers = [s for s in states if s[1] == "sleep" and s[3] != "sleep 600"]  # the orphan, or its zombie
        zombies = [s for s in states if s[2] == "Z"]
        if not leftovers and not zombies:
            break
        assert time.monotonic() < deadline, f"orphan not reaped by PID 1 (zombies: {zombies}): {states}"
        time.sleep(0.2)
    assert any(cmd == "sleep 600" for _, _, _, cmd in states), states
    stop = docker("stop", "-t", "10", cid, timeout=60)
    assert stop.returncode == 0
    assert docker("inspect", "-f", "{{.State.ExitCode}}", cid).stdout.strip() == "143"
