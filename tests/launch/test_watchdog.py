"""Whatever podguard starts dies with it, even when podguard is killed with SIGKILL (issue 7, item 6).

The parent-death signal reaches only a worker's first process: `bash -c 'python ...; ...'` loses bash and
leaves python holding the GPU. These tests SIGKILL a real podguard and check that the grandchildren die.
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

HELPER = Path(__file__).with_name("_launch_helper.py")
PY = sys.executable
PODGUARD = [PY, "-m", "podguard"]

# python that records its pid and ignores SIGTERM, so only a SIGKILL (after the grace) ends it
STUBBORN = textwrap.dedent(
    """
    import os, signal, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    open(sys.argv[1] + ".tmp", "w").write(str(os.getpid()))
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    time.sleep(120)
    """
)


def _wait_for_file(path: Path, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"timed out waiting for {path}"
        time.sleep(0.02)
    return int(path.read_text())


def _alive(pid: int) -> bool:
    """A live process (zombies count as gone: they hold no memory and init reaps them)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_gone(pid: int, timeout: float) -> float:
    """Seconds until `pid` is gone; fails (after killing it) when it outlives `timeout`."""
    t0 = time.monotonic()
    while _alive(pid):
        if time.monotonic() - t0 > timeout:
            os.kill(pid, signal.SIGKILL)
            pytest.fail(f"pid {pid} outlived podguard by more than {timeout:.0f} s")
        time.sleep(0.02)
    return time.monotonic() - t0


def test_sigkilled_podguard_run_takes_the_python_under_bash_with_it(cli_node, tmp_path):
    """The issue's own example: `podguard run -- bash -c 'python ...'`, then SIGKILL podguard."""
    pidfile = tmp_path / "python.pid"
    (tmp_path / "stubborn.py").write_text(STUBBORN)
    command = f"{PY} {tmp_path / 'stubborn.py'} {pidfile}; echo after"  # bash forks python, then waits
    proc = subprocess.Popen(
        [*PODGUARD, "run", "--grace", "1", "--", "bash", "-c", command],
        env=cli_node.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        pid = _wait_for_file(pidfile)
        proc.kill()  # SIGKILL: podguard can forward nothing, stop nothing
        proc.wait(timeout=10)
        took = _wait_gone(pid, timeout=8.0)  # grace 1 s, then SIGKILL from the watchdog
        assert took < 8.0
    finally:
        if proc.poll() is None:
            proc.kill()
        assert proc.stderr is not None
        proc.stderr.close()


def _helper(tmp_path: Path, specs: list[dict], grace: float) -> subprocess.Popen[bytes]:
    config = {"specs": specs, "grace": grace, "out": str(tmp_path / "out.txt"), "result": str(tmp_path / "r.json")}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return subprocess.Popen([PY, str(HELPER), str(tmp_path / "config.json")])


def test_grandchild_in_its_own_session_dies_with_a_sigkilled_supervisor(tmp_path):
    """A descendant that left the worker's process group (torchrun's workers do) is found by the job id
    it inherited in its environment."""
    pidfile = tmp_path / "escaped.pid"
    (tmp_path / "stubborn.py").write_text(STUBBORN)
    spawn = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, {str(tmp_path / 'stubborn.py')!r}, {str(pidfile)!r}],"
        " start_new_session=True)\n"
        "time.sleep(120)\n"
    )
    proc = _helper(tmp_path, [{"name": "job", "argv": [PY, "-c", spawn]}], grace=1.0)
    try:
        pid = _wait_for_file(pidfile)
        with open(f"/proc/{pid}/stat") as fh:
            assert int(fh.read().rsplit(")", 1)[1].split()[2]) == pid  # its own group: no killpg reaches it
        proc.kill()
        proc.wait(timeout=10)
        _wait_gone(pid, timeout=8.0)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_job_that_ends_normally_leaves_no_watchdog_behind(tmp_path):
    code = "import os; print(os.getppid(), flush=True)"
    proc = _helper(tmp_path, [{"name": "job", "argv": [PY, "-c", code]}], grace=1.0)
    assert proc.wait(timeout=30) == 0
    supervisor = proc.pid
    deadline = time.monotonic() + 5
    while True:  # the watchdog saw "end" and exited on its own (nothing was killed)
        left = [p for p in os.listdir("/proc") if p.isdigit() and _alive(int(p)) and _watchdog_of(int(p), supervisor)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert not left


def _watchdog_of(pid: int, supervisor: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
    except OSError:
        return False
    return any(a.endswith(b"_watchdog_program.py") for a in argv) and any(
        a.startswith(f"{supervisor}-".encode()) for a in argv
    )
